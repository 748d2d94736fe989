"""The `deepinfer` console script of the pip package: runs the packaged C executable
(deepinfer/bin/deepinfer) with the same arguments, so `deepinfer generate ...` after `pip install .`
is the same program as ./build/deepinfer. The executable finds the packaged model next to itself."""
import os
import sys

from ._lib import checkout_builds


def executable():
    here = os.path.dirname(os.path.abspath(__file__))
    exe = os.path.join(here, "bin", "deepinfer")
    if os.access(exe, os.X_OK):
        return exe
    env = os.environ.get("DEEPINFER_CLI")
    if env and os.access(env, os.X_OK):
        return env
    for exe in checkout_builds("deepinfer", sibling_builds=False):  # a source checkout (pip install -e .)
        if os.path.isfile(exe) and os.access(exe, os.X_OK):
            return exe
    sys.exit("deepinfer: the deepinfer executable is not in this package (deepinfer/bin/deepinfer): "
             "reinstall it with pip install . from the repository, or set DEEPINFER_CLI")


def main():
    exe = executable()
    os.execv(exe, [exe] + sys.argv[1:])


if __name__ == "__main__":
    main()
