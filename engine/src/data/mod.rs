//! Data in and out: input files and tables, Parquet read and written, output
//! rows and their digests, atomic writes under the one write rule, and cache
//! folders.

pub mod cache_dir;
pub mod files;
pub mod input_file;
pub mod parquet_headers;
pub mod parquet_read;
pub mod row_digest;
pub mod row_sink;
pub mod store_file;
pub mod tables;
pub mod write_guard;
