//! The library half of the `aisql` command line: its arguments and commands,
//! shared by the binary (`main.rs`), `aisql serve`, the shell and the Python
//! package (`python/`), which open sessions the way `aisql sql` does.

pub mod cli;
pub mod commands;
