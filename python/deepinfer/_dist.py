"""Several ranks for LLM(data_parallel_size=N, enable_expert_parallel=..., enable_eplb=..., eplb_config=...).

Outside mpirun, LLM(data_parallel_size=N) runs this program again as N ranks under mpirun (the
script from its start: `python3 script.py ...` or `python3 -c ...`; an interactive session cannot be
re-run) and this process only waits for them, passing Ctrl-C / SIGTERM on as a graceful stop, then
exits with their exit code. Under mpirun every rank reaches LLM(...): rank 0 returns from it and is
the front end (its engine places the requests on the ranks); the other ranks work inside it and end
when rank 0's LLM is closed (at the latest at exit). The other ranks' stdout goes to /dev/null.
The flags go to the library's own parser (di_dist_cli_setup), as the CLI's do.
"""
import atexit
import ctypes
import json
import os
import shutil
import signal
import subprocess
import sys
import weakref

_RANK_STDOUT = 'if [ "${OMPI_COMM_WORLD_RANK:-0}" != 0 ]; then exec "$@" > /dev/null; fi; exec "$@"'
_state = {"set_up": False, "keep": None}


def launched_by_mpi():
    return any(v in os.environ for v in ("OMPI_COMM_WORLD_SIZE", "PMIX_RANK", "PMI_RANK"))


def _die_with_parent():
    """In mpirun's process, before exec: SIGTERM when this launcher dies (even by SIGKILL), so the job ends."""
    try:
        ctypes.CDLL(None).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def relaunch(n):
    """Runs this program as n ranks under mpirun and exits with their exit code (never returns)."""
    mpirun = shutil.which("mpirun")
    if not mpirun:
        raise RuntimeError(f"LLM(data_parallel_size={n}) starts its ranks with mpirun, which is not on PATH "
                           "(Debian: apt-get install openmpi-bin)")
    argv = list(getattr(sys, "orig_argv", []))
    if len(argv) < 2 or sys.flags.interactive or argv[1] == "-" or (argv[1] == "-i"):
        raise RuntimeError(f"LLM(data_parallel_size={n}) runs this program again under mpirun: start it from a script "
                           f"(python3 script.py) or launch the ranks yourself (mpirun -np {n} python3 script.py)")
    env = dict(os.environ)
    if os.geteuid() == 0:  # OpenMPI refuses root without both
        env["OMPI_ALLOW_RUN_AS_ROOT"] = "1"
        env["OMPI_ALLOW_RUN_AS_ROOT_CONFIRM"] = "1"
    cmd = [mpirun, "--oversubscribe", "-np", str(n), "sh", "-c", _RANK_STDOUT, "sh", sys.executable] + argv[1:]
    sys.stdout.flush()
    sys.stderr.flush()
    p = subprocess.Popen(cmd, env=env, start_new_session=True, preexec_fn=_die_with_parent)
    got = []

    def forward(sig, _frame):  # the first: a graceful stop (rank 0 takes SIGUSR1 as Ctrl-C); then: kill
        p.send_signal(signal.SIGUSR1 if not got else signal.SIGTERM)
        got.append(sig)

    for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(s, forward)
    rc = p.wait()
    rc = 128 - rc if rc < 0 else rc
    if rc and got:
        rc = 128 + got[0]
    os._exit(rc)


def setup(lib, data_parallel_size, enable_expert_parallel, enable_eplb, eplb_config, dist_timeout):
    """Starts this process's rank (or relaunches under mpirun). Once per process."""
    n = int(data_parallel_size)
    if n < 1:
        raise ValueError(f"data_parallel_size must be at least 1, got {data_parallel_size}")
    if _state["set_up"]:
        raise RuntimeError("LLM: data_parallel_size / enable_expert_parallel: one such LLM per process "
                           "(the ranks end with it)")
    if enable_eplb and not enable_expert_parallel:
        raise ValueError("enable_eplb needs enable_expert_parallel=True")
    if n > 1 and not launched_by_mpi():
        relaunch(n)
    args = ["deepinfer", "LLM", "--data-parallel-size", str(n)]
    if enable_expert_parallel:
        args.append("--enable-expert-parallel")
    if enable_eplb:
        args.append("--enable-eplb")
    if eplb_config is not None:
        args += ["--eplb-config", eplb_config if isinstance(eplb_config, str) else json.dumps(eplb_config)]
    if dist_timeout is not None:
        args += ["--dist-timeout", str(float(dist_timeout))]
    keep = [a.encode() for a in args]
    argv = (ctypes.c_char_p * (len(keep) + 1))(*keep, None)
    argc = ctypes.c_int(len(keep))
    f = lib.di_dist_cli_setup
    f.restype = ctypes.c_int
    f.argtypes = [ctypes.POINTER(ctypes.c_int), ctypes.c_void_p]
    rc = f(ctypes.byref(argc), ctypes.cast(argv, ctypes.c_void_p))
    if rc != 0:
        raise ValueError(f"LLM: the distributed options were refused (exit code {rc}; the message is on stderr)")
    _state["set_up"] = True
    _state["keep"] = (keep, argv)


def close_at_exit(llm):
    """Rank 0: close the LLM at exit (its close stops the other ranks) if the program did not."""
    ref = weakref.ref(llm)
    atexit.register(lambda: ref() is not None and ref().close())
