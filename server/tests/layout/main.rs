//! The repository's layout held to its documents: the config reference against the
//! `Config` types, and the README's length and every relative link of the top-level
//! documents.

mod config_keys;
mod links;
