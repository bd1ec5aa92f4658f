from .dist_util import make_sampler, setup_dist

__all__ = ["make_sampler", "setup_dist"]
