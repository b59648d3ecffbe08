//! Training data: files of records in the common formats (alpaca, sharegpt, chat `messages`,
//! prompt/completion, text) or plain text, rendered with a chat template (loss on the replies
//! only), sequence packing, a seeded loader, and the held-out split for evaluation.

pub mod file;
pub mod format;
pub mod instruct;
pub mod loader;
pub mod micro_batch;
pub mod packing;
pub mod sample;
pub mod split;
pub mod text;

pub use file::{DataContent, parse_data, parse_jsonl, read_data};
pub use format::DataFormat;
pub use instruct::Conversation;
pub use loader::{DataLoader, DataSummary, LoaderState};
pub use micro_batch::MicroBatch;
pub use packing::{pack, pad_each};
pub use sample::Sample;
pub use split::hold_out;
