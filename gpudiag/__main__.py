import sys

from gpudiag.cli import main

# The guard matters: a Dask LocalCluster (`analyze --scheduler local:N`) starts its
# workers with multiprocessing's spawn, which imports this module again in each worker.
if __name__ == "__main__":
    sys.exit(main())
