//! The library's public surface, counted by one rule.
//!
//! From `src/lib.rs`, follow every `pub mod NAME;` to its file. In each file reached, count
//! each item declared `pub` at the file's top level (`fn`, `struct`, `enum`, `trait`,
//! `type`, `const`, `static`) and each name a top-level `pub use` makes public. An entity's
//! file (`src/entities/NAME.rs`) counts as one item: its `Model`, `Column` and the rest are
//! written by SeaORM's macros. Methods, fields, `pub(crate)` items and items of private
//! modules that no `pub use` names are not counted.

use std::collections::BTreeMap;

/// The public items reachable from the crate root, each as `file: name`, in `files`
/// (workspace-relative path to text).
pub fn public_items(files: &BTreeMap<String, String>) -> Vec<String> {
    let mut items = Vec::new();
    let mut pending = vec!["src/lib.rs".to_string()];
    while let Some(path) = pending.pop() {
        let Some(text) = files.get(&path) else {
            continue;
        };
        let children = child_dir(&path);
        let mut names = Vec::new();
        for statement in top_level_pub(text) {
            match statement {
                Public::Module(name) => {
                    let candidates = [
                        format!("{children}{name}.rs"),
                        format!("{children}{name}/mod.rs"),
                    ];
                    if let Some(found) = candidates.into_iter().find(|c| files.contains_key(c)) {
                        pending.push(found);
                    }
                }
                Public::Items(found) => names.extend(found),
            }
        }
        let is_entity = path.starts_with("src/entities/") && !path.ends_with("/mod.rs");
        if is_entity && !names.is_empty() {
            names = vec![entity_name(&path)];
        }
        items.extend(names.into_iter().map(|name| format!("{path}: {name}")));
    }
    items.sort();
    items
}

/// What a top-level `pub` statement declares.
enum Public {
    Module(String),
    Items(Vec<String>),
}

/// The folder a file's `mod NAME;` children live in.
fn child_dir(path: &str) -> String {
    match path
        .strip_suffix("/mod.rs")
        .or(path.strip_suffix("/lib.rs"))
    {
        Some(dir) => format!("{dir}/"),
        None => format!("{}/", path.trim_end_matches(".rs")),
    }
}

fn entity_name(path: &str) -> String {
    let file = path.rsplit('/').next().unwrap_or(path);
    format!("entity {}", file.trim_end_matches(".rs"))
}

/// The `pub` statements at the file's top level (a line that starts with `pub `).
fn top_level_pub(text: &str) -> Vec<Public> {
    let lines: Vec<&str> = text.lines().collect();
    let mut found = Vec::new();
    for (index, line) in lines.iter().enumerate() {
        let Some(rest) = line.strip_prefix("pub ") else {
            continue;
        };
        let mut words = rest.split_whitespace().peekable();
        let mut kind = "";
        while let Some(word) = words.next() {
            let qualifier = matches!(word, "async" | "unsafe" | "extern" | "\"C\"")
                || (word == "const" && words.peek() == Some(&"fn"));
            if !qualifier {
                kind = word;
                break;
            }
        }
        let name = || {
            let word = words.clone().next().unwrap_or("");
            word.split(['<', '(', ':', ';', '{', ' '])
                .next()
                .unwrap_or("")
                .to_string()
        };
        match kind {
            "mod" => found.push(Public::Module(name().trim_end_matches(';').to_string())),
            "fn" | "struct" | "enum" | "trait" | "type" | "const" | "static" => {
                found.push(Public::Items(vec![name()]))
            }
            "use" => {
                let mut statement = rest.to_string();
                let mut next = index + 1;
                while !statement.trim_end().ends_with(';') && next < lines.len() {
                    statement.push_str(lines[next]);
                    next += 1;
                }
                found.push(Public::Items(use_names(&statement)));
            }
            _ => {}
        }
    }
    found
}

/// The names a `use` statement brings in: each leaf of its tree, by its alias if it has
/// one; a glob is one name, `*`.
fn use_names(statement: &str) -> Vec<String> {
    let tree = statement
        .trim()
        .trim_start_matches("use")
        .trim_end_matches(';')
        .replace(['{', '}'], ",");
    tree.split(',')
        .map(str::trim)
        .filter(|leaf| !leaf.is_empty() && !leaf.ends_with("::"))
        .map(|leaf| match leaf.split_once(" as ") {
            Some((_, alias)) => alias.trim().to_string(),
            None => leaf.rsplit("::").next().unwrap_or(leaf).to_string(),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tree(files: &[(&str, &str)]) -> BTreeMap<String, String> {
        files
            .iter()
            .map(|(path, text)| (path.to_string(), text.to_string()))
            .collect()
    }

    #[test]
    fn public_modules_are_followed_and_their_top_level_items_counted() {
        let files = tree(&[
            (
                "src/lib.rs",
                "pub mod a;\nmod hidden;\npub mod entities;\npub(crate) mod c;\n",
            ),
            (
                "src/a/mod.rs",
                "pub mod b;\npub use inner::{One, two::Two as Deux, three};\npub async fn go() {}\npub(crate) fn not() {}\nimpl X {\n    pub fn method() {}\n}\npub const fn k() {}\n",
            ),
            (
                "src/a/b.rs",
                "pub struct S<T> {\n    pub field: T,\n}\npub const N: u8 = 1;\n",
            ),
            ("src/hidden.rs", "pub fn unreachable() {}\n"),
            ("src/c.rs", "pub fn crate_only() {}\n"),
            ("src/entities/mod.rs", "pub mod record;\n"),
            (
                "src/entities/record.rs",
                "pub struct Model;\npub enum Relation {}\npub const KEY: u8 = 1;\n",
            ),
        ]);
        assert_eq!(
            public_items(&files),
            [
                "src/a/b.rs: N",
                "src/a/b.rs: S",
                "src/a/mod.rs: Deux",
                "src/a/mod.rs: One",
                "src/a/mod.rs: go",
                "src/a/mod.rs: k",
                "src/a/mod.rs: three",
                "src/entities/record.rs: entity record",
            ]
        );
    }
}
