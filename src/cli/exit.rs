//! The process's exit codes, apart from `cli`'s root so that the commands returning them
//! do not import it.

/// Exit code for a bad config or command line.
pub(super) const EXIT_CONFIG: u8 = 2;
/// Exit code when a run failed or the database could not be used.
pub(super) const EXIT_FAILURE: u8 = 1;
/// Exit code when the database's schema does not let this binary go on: a newer release
/// migrated it, or migrating it would leave instances of an older schema writing.
pub(super) const EXIT_SCHEMA: u8 = 4;
