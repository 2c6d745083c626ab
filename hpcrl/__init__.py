"""hpcrl: Gorila (Nair et al. 2015) and the asynchronous methods (Mnih et al. 2016) over MPI."""

__version__ = "0.1.0"
