from setuptools import setup
from torch.utils.cpp_extension import BuildExtension, CUDAExtension

setup(
    name="pointnet2_ext",
    ext_modules=[CUDAExtension("pointnet2_ext", ["group_points.cpp", "group_points_gpu.cu"])],
    cmdclass={"build_ext": BuildExtension},
)
