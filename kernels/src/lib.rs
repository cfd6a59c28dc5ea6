//! Compute kernels used by the aisql models: attention of many suffixes over one
//! shared prefix KV and the restricted TRUE/FALSE output head. CPU versions are
//! always built; CUDA versions live behind the `cuda` feature.
