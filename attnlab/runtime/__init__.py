"""Where a run runs: the device, the precision measured to be faster there, whether it fits in memory,
and the processes torchrun started."""
