"""`deepinfer score` for the Python tests: the logits of a token sequence at every position, read back
from the safetensors file the command writes (stdlib only; shared by test_eval, test_llm, test_server)."""
import json
import os
import struct
import subprocess
import tempfile


def score_logits(cli, model_dir, ids, extra_args=()):
    """One list of vocab floats per position of ids."""
    with tempfile.TemporaryDirectory() as d:
        out = os.path.join(d, "l.safetensors")
        subprocess.run([cli, "score", "--model", model_dir, *extra_args, "--threads", "2",
                        "--ids", ",".join(map(str, ids)), "--out", out], capture_output=True, check=True)
        with open(out, "rb") as f:
            n = struct.unpack("<Q", f.read(8))[0]
            t = json.loads(f.read(n))["logits"]
            rows, vocab = t["shape"]
            f.seek(8 + n + t["data_offsets"][0])
            data = struct.unpack(f"<{rows * vocab}f", f.read(rows * vocab * 4))
    return [data[i * vocab:(i + 1) * vocab] for i in range(rows)]
