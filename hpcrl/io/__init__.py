"""Files a run leaves behind: checkpoint generations and ``metrics.h5`` (HDF5, no pickle)."""
