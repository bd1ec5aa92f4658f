"""Reference trainers: the article's single-device, DataParallel and DDP training loops.

``python -m gpudiag.reference --help`` lists the options; ``gpudiag bench`` runs them
under capture and prints the single vs DP vs DDP comparison table.
"""
