"""The demos of the README (`gpufleet demo`, `gpufleet demo --lending`): the local environment healing a
training job. Development only: neither the wheel nor the images ship this package."""
