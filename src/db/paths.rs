//! Where a SQLite database lives on disk, and the lock files beside it.

/// The file of a `sqlite://FILE?...` URL; `None` for other backends and in-memory SQLite.
pub(crate) fn sqlite_file(database_url: &str) -> Option<std::path::PathBuf> {
    let rest = database_url
        .strip_prefix("sqlite://")
        .or_else(|| database_url.strip_prefix("sqlite:"))?;
    let file = rest.split('?').next().unwrap_or(rest);
    if file.is_empty() || file == ":memory:" {
        return None;
    }
    Some(std::path::PathBuf::from(file))
}

/// The path of the lock file `<database file>.<purpose>.lock`.
pub(crate) fn lock_path(database_file: &std::path::Path, purpose: &str) -> std::path::PathBuf {
    let mut path = database_file.as_os_str().to_owned();
    path.push(format!(".{purpose}.lock"));
    std::path::PathBuf::from(path)
}
