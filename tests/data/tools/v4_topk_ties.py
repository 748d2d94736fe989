"""Checks the selection procedure src/backend/cpu/cpu_deepseek_v4.c uses to reproduce torch.topk's
tie-breaking on CPU (heap select when k*64 <= n, else introselect): a Python model of the same
procedure against torch.topk on random tie-heavy rows. Dev tool (needs torch); prints the mismatch count.
usage: python3 v4_topk_ties.py
"""
import torch, random, math
def comp(x,y): return x[0]>y[0]
def adjust_heap(a,f,hole,ln,val):
    top=hole; sc=hole
    while sc < (ln-1)//2:
        sc=2*(sc+1)
        if comp(a[f+sc],a[f+sc-1]): sc-=1
        a[f+hole]=a[f+sc]; hole=sc
    if (ln&1)==0 and sc==(ln-2)//2:
        sc=2*(sc+1); a[f+hole]=a[f+sc-1]; hole=sc-1
    par=(hole-1)//2
    while hole>top and comp(a[f+par],val):
        a[f+hole]=a[f+par]; hole=par; par=(hole-1)//2
    a[f+hole]=val
def heap_select(a,f,mid,l):
    ln=mid-f
    if ln>=2:
        par=(ln-2)//2
        while True:
            adjust_heap(a,f,par,ln,a[f+par])
            if par==0: break
            par-=1
    for i in range(mid,l):
        if comp(a[i],a[f]):
            v=a[i]; a[i]=a[f]; adjust_heap(a,f,0,ln,v)
def ins_sort(a,f,l):
    if f==l: return
    for i in range(f+1,l):
        if comp(a[i],a[f]):
            v=a[i]; a[f+1:i+1]=a[f:i]; a[f]=v
        else:
            v=a[i]; j=i; 
            while comp(v,a[j-1]): a[j]=a[j-1]; j-=1
            a[j]=v
def med3(a,r,x,y,z):
    if comp(a[x],a[y]):
        if comp(a[y],a[z]): s=y
        elif comp(a[x],a[z]): s=z
        else: s=x
    elif comp(a[x],a[z]): s=x
    elif comp(a[y],a[z]): s=z
    else: s=y
    a[r],a[s]=a[s],a[r]
def upart(a,f,l,p):
    while True:
        while comp(a[f],a[p]): f+=1
        l-=1
        while comp(a[p],a[l]): l-=1
        if not f<l: return f
        a[f],a[l]=a[l],a[f]; f+=1
def nth(a,f,n,l):
    if f==l or n==l: return
    depth=2*int(math.floor(math.log2(l-f)))
    while l-f>3:
        if depth==0:
            heap_select(a,f,n+1,l); a[f],a[n]=a[n],a[f]; return
        depth-=1
        mid=f+(l-f)//2
        med3(a,f,f+1,mid,l-1)
        cut=upart(a,f+1,l,f)
        if cut<=n: f=cut
        else: l=cut
    ins_sort(a,f,l)
def mytopk(vals,k):
    a=[(v,i) for i,v in enumerate(vals)]
    if k*64<=len(a):
        heap_select(a,0,k,len(a))
    else:
        nth(a,0,k-1,len(a))
    return sorted(i for _,i in a[:k])
random.seed(1); bad=0
for trial in range(3000):
    n=random.randint(1,3000); k=random.randint(1,min(n,80))
    vals=[random.choice([0.0,0.0,1.0,-1.0,2.0,float('-inf'),random.random()]) for _ in range(n)]
    t=torch.tensor(vals,dtype=torch.float32)
    ref=sorted(torch.topk(t,k).indices.tolist())
    if ref!=mytopk([float(x) for x in t],k): bad+=1
print('mismatch',bad)
