#!/usr/bin/env bash
# Packs Debian's OpenMPI runtime (mpirun = orterun, orted, the MCA plugins a one-host job over shared
# memory / TCP needs, libmpi / libopen-rte / libopen-pal / PMIx and what they link) into one
# relocatable xz tarball, for device machines whose image has no OpenMPI (issue 21's several-rank GPU
# checks, tests/cuda/ep_multi_rank_check.sh). Usage (on the build machine, where openmpi-bin is
# installed):  scripts/pack_openmpi.sh OUT.tar.xz
# On the device:  tar xJf OUT.tar.xz -C /tmp && . /tmp/ompi/env.sh
# env.sh points OpenMPI at the relocated tree (OPAL_PREFIX and the install-dir variables OpenMPI's
# "env" installdirs component reads, PMIx's component path) and picks the transports that are packed
# (btl self,vader,tcp; pml ob1): InfiniBand / UCX / OFI plugins are left out, so this pack is for one
# host (several hosts want the full Debian install).
set -euo pipefail
OUTF=${1:?usage: pack_openmpi.sh OUT.tar.xz}
D=/usr/lib/x86_64-linux-gnu
PLUG=$D/openmpi/lib/openmpi3
T=$(mktemp -d)
R=$T/ompi
mkdir -p "$R/bin" "$R/lib/openmpi3" "$R/lib/pmix" "$R/share/openmpi" "$R/share/pmix" "$R/etc"
cp -L /usr/bin/orterun "$R/bin/orterun"
cp -L /usr/bin/orted "$R/bin/orted"
ln -s orterun "$R/bin/mpirun"
ln -s orterun "$R/bin/mpiexec"
# plugins: everything except the fabrics not packed (UCX, OFI, PSM, verbs), MPI-IO, OpenSHMEM, the
# monitoring / tracing ones and the batch systems'
for f in "$PLUG"/mca_*.so; do
  n=$(basename "$f")
  case "$n" in
    *ucx*|*ofi*|*psm*|*openib*|*verbs*|*io_*|*fcoll_*|*fbtl_*|*fs_*|*sharedfp_*|*memheap_*|*scoll_*|*spml_*|*sshmem_*|\
    *atomic_*|*monitoring*|*vprotocol*|*treematch*|*mtl_*|*pml_cm*|*osc_rdma*|*slurm*|*flux*|*jsm*|*gridengine*|\
    *compress_*|*_tool.so|*pspawn*|*crs_*) continue ;;
  esac
  cp -L "$f" "$R/lib/openmpi3/"
done
cp -L $D/pmix2/lib/pmix/*.so "$R/lib/pmix/"
cp -L /usr/share/openmpi/help-*.txt "$R/share/openmpi/" 2>/dev/null || true
cp -L $D/pmix2/share/pmix/help-*.txt "$R/share/pmix/" 2>/dev/null || true
# every library they link, except glibc's and the C/C++ runtime the device image has
libs=$(ldd "$R"/bin/orterun "$R"/bin/orted "$R"/lib/openmpi3/*.so "$R"/lib/pmix/*.so $D/libmpi.so.40 2>/dev/null |
       awk '/=> \// {print $3}' | sort -u |
       grep -v -E '/libc\.so|/libm\.so|/libpthread|/libdl\.so|/librt\.so|/ld-linux|/libgcc_s|/libstdc' || true)
for l in $libs $D/libmpi.so.40; do cp -L "$l" "$R/lib/"; done
strip --strip-unneeded "$R"/bin/orterun "$R"/bin/orted "$R"/lib/*.so* "$R"/lib/openmpi3/*.so "$R"/lib/pmix/*.so 2>/dev/null || true
cat >"$R/env.sh" <<'ENV'
# source this: OpenMPI from this relocated tree (scripts/pack_openmpi.sh)
OMPI_HERE=$(cd "$(dirname "${BASH_SOURCE[0]:-$0}")" && pwd)
export OPAL_PREFIX=$OMPI_HERE OPAL_EXEC_PREFIX=$OMPI_HERE OPAL_BINDIR=$OMPI_HERE/bin OPAL_LIBDIR=$OMPI_HERE/lib
export OPAL_PKGLIBDIR=$OMPI_HERE/lib/openmpi3 OPAL_DATADIR=$OMPI_HERE/share OPAL_PKGDATADIR=$OMPI_HERE/share/openmpi
export OPAL_SYSCONFDIR=$OMPI_HERE/etc OPAL_DATAROOTDIR=$OMPI_HERE/share
export OMPI_MCA_mca_base_component_path=$OMPI_HERE/lib/openmpi3
export PMIX_INSTALL_PREFIX=$OMPI_HERE PMIX_MCA_mca_base_component_path=$OMPI_HERE/lib/pmix
export PATH=$OMPI_HERE/bin:$PATH LD_LIBRARY_PATH=$OMPI_HERE/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
export OMPI_MCA_btl=self,vader,tcp OMPI_MCA_pml=ob1 OMPI_MCA_btl_vader_single_copy_mechanism=none
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
# a PMIx of another version on the machine: its plugins fail to load (harmless, but loud)
export PMIX_MCA_mca_base_component_show_load_errors=0 PMIX_MCA_pcompress_base_silence_warning=1
ENV
tar cf - -C "$T" ompi | xz -9e >"$OUTF"
rm -rf "$T"
ls -la "$OUTF"
