"""When ggtool's kernels are compiled: in a first-ever run, a kernel not in the cache yet runs as its
numpy twin for small work and is compiled for large work (``first_run``), or ahead in side
processes; the background process fills the cache for the next run (``warm``).

It sits above the type records (``ggtool.qtypes``): compiling a block type's dot packs a row of it,
and weighing its twin asks the record what decoding costs. The kernels and the cache's folders and
markers are below (``ggtool.kernels``); ``quant`` and the layers above call this policy. Nothing is
imported with the package: the background compiler loads only what the kernel it compiles needs."""
