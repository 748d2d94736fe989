"""How LLM.loglikelihood and LLM.loglikelihood_rolling turn text into token sequences (pure functions
over an `encode(text) -> [ids]` callable), following lm-evaluation-harness's conventions so that
scores are comparable with it.

Pairs (context, continuation):
  1. Trailing whitespace of the context moves to the front of the continuation ("Q: x\\nA: " + "y"
     is scored as "Q: x\\nA:" + " y"), as lm-evaluation-harness does.
  2. The continuation's tokens are those of encode(context + continuation) after the context's own
     tokens. If that encoding does not start with the context's tokens (a merge across the
     boundary), or leaves nothing after them, the two are encoded separately and concatenated.
  3. The sequence starts with the prefix token when there is one (the tokenizer's BOS when its
     add_bos_token is set: the model's training format, as the engine encodes prompts); an empty
     context always gets a prefix token (BOS, else EOS: lm-evaluation-harness's prefix_token_id).
  4. A sequence longer than the model's window loses tokens on the left (the continuation must fit).

Rolling (perplexity of whole texts, lm-evaluation-harness's loglikelihood_rolling): the text's tokens
are cut into disjoint windows of at most `max_length` predicted tokens; the first window is
[prefix] + tokens[:L]; each later window predicts the next min(L, rest) tokens and is filled on the
left with the tokens before them up to L fed tokens (one context token for a full window, more for
the last, shorter one), so every token is predicted exactly once.
"""


def encode_pair(encode, context, continuation, prefix):
    """(ids, start): the sequence and where the continuation begins. `prefix`: list of 0 or 1 ids
    put before the context; `encode` encodes without special tokens."""
    n_space = len(context) - len(context.rstrip())
    if n_space:
        continuation = context[-n_space:] + continuation
        context = context[:-n_space]
    if not continuation:
        raise ValueError("loglikelihood: the continuation is empty")
    ctx = encode(context) if context else []
    whole = encode(context + continuation)
    if whole[:len(ctx)] == ctx and len(whole) > len(ctx):
        cont = whole[len(ctx):]
    else:
        cont = encode(continuation)
    if not cont:
        raise ValueError(f"loglikelihood: the continuation {continuation!r} encodes to no tokens")
    ids = list(prefix) + ctx + cont
    return ids, len(ids) - len(cont)


def truncate_left(ids, start, max_len):
    """Keeps the last max_len tokens (the whole continuation must fit, with one context token)."""
    n_cont = len(ids) - start
    if n_cont + 1 > max_len:
        raise ValueError(f"loglikelihood: the continuation has {n_cont} tokens; with one token of context it "
                         f"does not fit the model's {max_len}-token window")
    if len(ids) <= max_len:
        return ids, start
    return ids[len(ids) - max_len:], max_len - n_cont


def rolling_windows(tokens, prefix_token, max_length):
    """[(ids, start)] covering `tokens`: each token predicted once, each window at most max_length + 1
    tokens long (max_length predicted, all but the last fed to the model)."""
    if max_length < 1:
        raise ValueError(f"max_length must be at least 1, got {max_length}")
    out = []
    first = min(max_length, len(tokens))
    if first:
        out.append(([prefix_token] + tokens[:first], 1))
    done = first
    while done < len(tokens):
        n = min(max_length, len(tokens) - done)
        s = done + n - max_length - 1  # >= 0: the window fills max_length fed tokens
        out.append((tokens[s:done + n], done - s))
        done += n
    return out
