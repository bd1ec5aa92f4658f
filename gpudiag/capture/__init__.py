"""Capture: everything that runs inside the training processes and the per-node launcher.

``gpudiag trace`` (launcher.py) starts the job; every rank runs worker.py, which installs
the step tracker (steps.py), the profiler window (profiling.py) and the collective
recorder, then runs the user's script unchanged. All output goes through gpudiag.rundir.
"""
