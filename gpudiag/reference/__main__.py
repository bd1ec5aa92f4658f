import sys

from gpudiag.reference.train import main

sys.exit(main())
