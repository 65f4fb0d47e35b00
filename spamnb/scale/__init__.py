"""Scale: sharded training and ordered parallel classification, on local processes or Dask."""
