//! Kernel specs to CUDA C through handlebars templates (`templates/*.cu.hbs`, strict mode, no
//! HTML escaping); shared device code lives in `kernels/*.cuh`. Knows nothing of cudarc.
