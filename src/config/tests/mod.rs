//! Tests of `config`'s parts read through `Settings`, kept out of the parts' files so
//! that no part imports `config`'s root (which imports the parts).

mod budget;
mod notify;
mod streams;
mod webhooks;
