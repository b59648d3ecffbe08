//! Training data: files of records in the common formats (alpaca, sharegpt, chat `messages`,
//! prompt/completion, text) or plain text, rendered with a chat template (loss on the replies
//! only), sequence packing, a seeded loader, and the held-out split for evaluation; preference
//! pairs (prompt, chosen, rejected) and their micro-batches.

pub mod file;
pub mod format;
pub mod instruct;
pub mod loader;
pub mod micro_batch;
pub mod packing;
pub mod pair_batch;
pub mod pair_loader;
pub mod preference;
pub mod sample;
pub mod split;
pub mod text;

pub use file::{DataContent, parse_data, parse_jsonl, read_data};
pub use format::DataFormat;
pub use instruct::Conversation;
pub use loader::{DataLoader, DataSummary, LoaderState};
pub use micro_batch::MicroBatch;
pub use packing::{pack, pad_each};
pub use pair_batch::{PairBatch, Role};
pub use pair_loader::{PairLoader, ordered_pair_batches};
pub use preference::{PairTokens, PreferencePair, parse_pairs, read_pairs};
pub use sample::Sample;
pub use split::hold_out;
