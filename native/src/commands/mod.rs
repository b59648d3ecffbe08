//! One module per subcommand.

pub mod bench;
pub mod eval;
pub mod generate;
pub mod inspect;
pub mod quantize;
pub mod train;
