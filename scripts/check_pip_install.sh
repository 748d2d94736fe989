#!/usr/bin/env bash
# The Python package as a user installs it: `pip install <source>` into a fresh virtual environment,
# then, from another directory, LLM() on the packaged model and the `deepinfer` console script.
#   scripts/check_pip_install.sh [SOURCE_DIR]   (default: this checkout)
# The CUDA backend is left out (CMAKE_ARGS=-DDI_CUDA=OFF) to keep the check quick; the switch is the
# CMake build's own, tested there. Needs python3 with venv (python3-venv) and PyPI for scikit-build-core.
set -euo pipefail
SRC="$(cd "${1:-$(dirname "$0")/..}" && pwd)"
WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT
python3 -m venv "$WORK/venv"
echo "check_pip_install: pip install $SRC (into a fresh venv)" >&2
CMAKE_ARGS="-DDI_CUDA=OFF ${CMAKE_ARGS:-}" "$WORK/venv/bin/pip" install --disable-pip-version-check --progress-bar off "$SRC"
mkdir "$WORK/elsewhere"
cd "$WORK/elsewhere"
# no repository paths: the package must bring its library, executable and model itself
env -u DEEPINFER_LIB -u DEEPINFER_CLI -u DEEPINFER_HF_MODEL_DIR -u PYTHONPATH "$WORK/venv/bin/python" -c "
from deepinfer import LLM, SamplingParams
import deepinfer, os
llm = LLM()
assert llm.model_dir.startswith(os.path.dirname(deepinfer.__file__)), llm.model_dir
text = llm.generate(['Hello'], SamplingParams(max_tokens=8, temperature=0))[0].outputs[0].text
assert text, 'no text generated'
print('check_pip_install: LLM() from', llm.model_dir, '->', repr(text))
"
env -u DEEPINFER_LIB -u DEEPINFER_CLI -u DEEPINFER_HF_MODEL_DIR "$WORK/venv/bin/deepinfer" --help >/dev/null
out="$(env -u DEEPINFER_HF_MODEL_DIR "$WORK/venv/bin/deepinfer" generate --prompt Hello --max-tokens 4 --temperature 0 --output-format json)"
echo "check_pip_install: deepinfer generate -> $out" >&2
echo "$out" | "$WORK/venv/bin/python" -c 'import json, sys; d = json.load(sys.stdin); assert len(d["ids"]) >= 1, d'
echo "check_pip_install: 1 passed, 0 failed"
