//! Training data: instruction JSONL rendered with a chat template (loss on the replies only),
//! plain text for causal language modelling, sequence packing, and a seeded loader.

pub mod instruct;
pub mod loader;
pub mod packing;
pub mod sample;
pub mod text;

pub use instruct::{Conversation, read_jsonl};
pub use loader::{DataLoader, LoaderState};
pub use packing::{pack, pad_each};
pub use sample::Sample;
