"""One BLAS thread for spotbag's own numerical work.

numpy and scipy each load an OpenBLAS that starts a worker thread per CPU. spotbag's
linear algebra is tiny (the 1-4 parameter fits' L-BFGS-B steps), and after each call
those workers spin, waiting for more work, on CPUs the job programs and the event loop
need: on 2 CPUs `spotbag fit` on the shipped lifetimes took 2.4-2.8 s CPU with them
and 1.2 s without, the same fits to the last bit (`bench/cli_tools.py`).

The limit is set at run time through threadpoolctl (on the libraries loaded then), not
by OPENBLAS_NUM_THREADS, which the daemon's job processes would inherit.
"""

from __future__ import annotations

from threadpoolctl import threadpool_limits


def one_blas_thread() -> threadpool_limits:
    """A context manager (or, called alone, a process-wide setting) limiting the BLAS
    libraries loaded so far to one thread each; load scipy.optimize before calling."""
    return threadpool_limits(limits=1, user_api="blas")
