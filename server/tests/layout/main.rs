//! The repository's layout held to its documents: the config reference against the
//! `Config` types, the README's length and every relative link of the top-level documents,
//! and no import circle between sibling modules in any crate of the workspace.

mod circles;
mod config_keys;
mod links;
mod source;
