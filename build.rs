//! Sets `TRIBUTARY_RELEASE`, what `tributary --version` prints and instances announce:
//! the crate's version and, when built from a git checkout, the commit, so that two
//! builds of one version tell apart. Without git or outside a checkout (a tarball), the
//! version alone.

use std::path::PathBuf;
use std::process::Command;

fn main() {
    let version = std::env::var("CARGO_PKG_VERSION").unwrap_or_default();
    let release = match git(&["rev-parse", "--short=12", "HEAD"]) {
        Some(commit) if commit.chars().all(|c| c.is_ascii_hexdigit()) => {
            format!("{version} ({commit})")
        }
        _ => version,
    };
    println!("cargo:rustc-env=TRIBUTARY_RELEASE={release}");
    println!("cargo:rerun-if-changed=build.rs");
    // Built again when HEAD moves: HEAD itself, the branch it names, and packed refs.
    // Only files that exist are named; cargo would run the script on every build for one
    // that does not.
    let mut watched = Vec::new();
    if let Some(git_dir) = git(&["rev-parse", "--git-dir"]) {
        watched.push(PathBuf::from(git_dir).join("HEAD"));
    }
    if let Some(common) = git(&["rev-parse", "--git-common-dir"]) {
        let common = PathBuf::from(common);
        watched.push(common.join("packed-refs"));
        if let Some(branch) = git(&["symbolic-ref", "-q", "HEAD"]) {
            watched.push(common.join(branch));
        }
    }
    for path in watched.into_iter().filter(|path| path.exists()) {
        println!("cargo:rerun-if-changed={}", path.display());
    }
}

/// `git ARGS` in the package's folder, its output trimmed; `None` when git is missing,
/// fails, or says nothing.
fn git(args: &[&str]) -> Option<String> {
    let output = Command::new("git")
        .args(args)
        .current_dir(std::env::var_os("CARGO_MANIFEST_DIR")?)
        .output()
        .ok()?;
    if !output.status.success() {
        return None;
    }
    let text = String::from_utf8(output.stdout).ok()?.trim().to_string();
    (!text.is_empty()).then_some(text)
}
