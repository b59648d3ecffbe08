//! One module per subcommand.

pub mod bench;
pub mod estimate;
pub mod eval;
pub mod exercise;
pub mod generate;
pub mod inspect;
pub mod measure;
pub mod quantize;
pub mod train;
