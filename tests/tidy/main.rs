//! Tidy checks: rules about the source itself, run as ordinary tests (as rust-analyzer
//! does), so breaking one fails CI like any other test.
//!
//! - The layers: each top-level module of `src/` imports only what its row in
//!   ARCHITECTURE.md's "Layers" table allows, and each row allows only rows above it; so
//!   does each sub-module of `pipeline` by the "Pipeline layers" table, and no file of
//!   `src/` imports, through others, a file that imports it.
//! - Only `cli` prints, and neither `cli` nor `api` queries the database: they call `ops`.
//! - Only `pipeline` writes `records`.
//! - The providers crate cannot reach the database, and its top-level modules import
//!   each other without a cycle (its root's re-exports followed to their modules).
//! - Every crate lays a module with sub-modules out as `NAME/mod.rs`.
//! - The library's public items (counted as `public.rs` says) stay under their ceiling.

mod public;
mod scan;

use std::collections::btree_map::Entry;
use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::path::{Path, PathBuf};

use public::public_items;

/// Macros that write to the terminal.
const PRINTING: [&str; 4] = ["println", "eprintln", "print", "eprint"];

/// The functions of a SeaORM entity that write rows.
const ENTITY_WRITES: [&str; 7] = [
    "insert",
    "insert_many",
    "update",
    "update_many",
    "delete",
    "delete_many",
    "delete_by_id",
];

/// Crates whose presence would let the providers crate reach the database.
const DATABASE_CRATES: [&str; 5] = [
    "sea-orm",
    "sea-query",
    "sqlx",
    "tributary",
    "tributary-migrations",
];

/// Crates through which code reaches the database.
const DATABASE_PATHS: [&str; 4] = ["sea_orm", "sea_query", "sqlx", "rusqlite"];

/// One source file: its path as shown in messages, and its text.
struct SourceFile {
    path: String,
    text: String,
}

/// The allowed imports of each sub-module of one module (the crate root's top-level
/// modules, or `pipeline`'s), in the table's order.
#[derive(Debug)]
struct Layers {
    /// The section's title, as messages name the table.
    title: String,
    /// The module whose sub-modules the rows are: `[]` for the crate root.
    scope: Vec<String>,
    rows: Vec<(String, BTreeSet<String>)>,
}

impl Layers {
    /// Reads the table of the `## Layers` section, the crate root's.
    fn parse(markdown: &str) -> Result<Layers, String> {
        Layers::parse_section(markdown, "Layers", &[])
    }

    /// Reads the table of the `## Pipeline layers` section, `pipeline`'s.
    fn parse_pipeline(markdown: &str) -> Result<Layers, String> {
        Layers::parse_section(markdown, "Pipeline layers", &["pipeline"])
    }

    /// Reads the table of the `## {title}` section: `| `module` | `a`, `b` |` rows, where
    /// `—` allows nothing.
    fn parse_section(markdown: &str, title: &str, scope: &[&str]) -> Result<Layers, String> {
        let section = format!("\n{markdown}");
        let section = section
            .split("\n## ")
            .find(|section| section.starts_with(&format!("{title}\n")))
            .ok_or(format!("ARCHITECTURE.md has no `## {title}` section"))?;
        let mut rows = Vec::new();
        for line in section.lines().filter(|line| line.starts_with("| `")) {
            let cells: Vec<&str> = line.trim_matches('|').split('|').map(str::trim).collect();
            let [module, imports] = cells[..] else {
                return Err(format!("a {title} row has other than two cells: {line}"));
            };
            let names = |cell: &str| -> BTreeSet<String> {
                cell.split(',')
                    .map(|name| name.trim().trim_matches('`').to_string())
                    .filter(|name| !name.is_empty() && name != "—")
                    .collect()
            };
            let module = names(module).into_iter().next().unwrap_or_default();
            rows.push((module, names(imports)));
        }
        Ok(Layers {
            title: title.to_string(),
            scope: scope.iter().map(|name| name.to_string()).collect(),
            rows,
        })
    }

    /// Each row names only modules of rows above it, so the graph is a line.
    fn check_order(&self) -> Vec<String> {
        let mut above = BTreeSet::new();
        let mut problems = Vec::new();
        for (module, imports) in &self.rows {
            for import in imports.iter().filter(|import| !above.contains(*import)) {
                problems.push(format!(
                    "ARCHITECTURE.md, {}: `{module}` may import `{import}`, which is not a row above it",
                    self.title
                ));
            }
            above.insert(module.clone());
        }
        problems
    }

    fn allows(&self, from: &str, to: &str) -> Option<bool> {
        self.rows
            .iter()
            .find(|(module, _)| module == from)
            .map(|(_, imports)| imports.contains(to))
    }

    fn modules(&self) -> BTreeSet<&str> {
        self.rows
            .iter()
            .map(|(module, _)| module.as_str())
            .collect()
    }

    /// The row a file of module `module` belongs to: the sub-module of the scope it is
    /// in. `None` outside the scope, and for the scope's own file (`pipeline/mod.rs`),
    /// which stands above every row.
    fn row_of<'m>(&self, module: &'m [String]) -> Option<&'m str> {
        module
            .strip_prefix(self.scope.as_slice())
            .and_then(|rest| rest.first())
            .map(String::as_str)
    }

    /// What a path of ours, resolved from the crate root, imports in the scope: the
    /// sub-module it names, or, for an item of `pipeline/mod.rs` (no row's), that file,
    /// named as the scope. `None` outside the scope.
    fn target<'p>(&'p self, path: &'p [String]) -> Option<&'p str> {
        let rest = path.strip_prefix(self.scope.as_slice())?;
        let name = rest.first().filter(|name| *name != "self");
        match (name, self.scope.last()) {
            (Some(name), Some(scope)) if !self.modules().contains(name.as_str()) => Some(scope),
            (Some(name), _) => Some(name),
            (None, scope) => scope.map(String::as_str),
        }
    }

    /// The imports of one file that its row does not allow, each naming file, line and edge.
    fn problems(&self, path: &str, module: &[String], scan: &scan::Scan) -> Vec<String> {
        let Some(from) = self.row_of(module) else {
            return Vec::new();
        };
        let title = &self.title;
        let mut problems = Vec::new();
        if !self.modules().contains(from) {
            problems.push(format!(
                "{path}: module `{from}` has no row in ARCHITECTURE.md's {title} table"
            ));
        }
        let mut seen = BTreeSet::new();
        for (line, ours) in &scan.ours {
            let Some(to) = self.target(ours) else {
                continue;
            };
            // One message per line and edge, however many names a group imports.
            if !seen.insert((line, to)) {
                continue;
            }
            if to != from && self.allows(from, to) == Some(false) {
                problems.push(format!(
                    "{path}:{line}: `{from}` imports `{to}`, which ARCHITECTURE.md's {title} table does not allow"
                ));
            }
        }
        problems
    }
}

/// The module path of a file under `src/`: `pipeline/store.rs` is `["pipeline", "store"]`,
/// `pipeline/mod.rs` is `["pipeline"]`, `lib.rs` is `[]`.
fn module_path(path: &str) -> Vec<String> {
    module_path_in("src", path)
}

/// The module path of a file under `source`, its crate's source folder.
fn module_path_in(source: &str, path: &str) -> Vec<String> {
    let relative = path
        .strip_prefix(source)
        .and_then(|rest| rest.strip_prefix('/'))
        .unwrap_or(path);
    let relative = relative.strip_suffix(".rs").unwrap_or(relative);
    relative
        .split('/')
        .filter(|part| !matches!(*part, "mod" | "lib" | "main"))
        .map(str::to_string)
        .collect()
}

/// Everything wrong with `files` against each of `tables`, one message per problem, each
/// naming the file and line.
fn check(tables: &[&Layers], files: &[SourceFile]) -> Vec<String> {
    let mut problems: Vec<String> = tables.iter().flat_map(|t| t.check_order()).collect();
    let mut scanned = Vec::new();
    for file in files {
        let module = module_path(&file.path);
        // Test code sits outside the layers, as `tests/` does: the library's test files
        // (`tests.rs` beside the module they test) and the harness they share.
        if module.last().is_some_and(|name| name == "tests")
            || module.first().is_some_and(|name| name == "testing")
        {
            continue;
        }
        let scan = match scan::scan(&module, &file.text) {
            Ok(scan) => scan,
            Err(error) => {
                problems.push(format!("{}: cannot be parsed: {error}", file.path));
                continue;
            }
        };
        // `src/main.rs` is the binary's own crate root; its `crate::` is not the library.
        let binary = file.path == "src/main.rs";
        let top = module.first().map(String::as_str);
        if !binary {
            for layers in tables {
                problems.extend(layers.problems(&file.path, &module, &scan));
            }
        }
        if top != Some("cli") {
            for (line, name) in &scan.macros {
                if PRINTING.contains(&name.as_str()) {
                    problems.push(format!(
                        "{}:{line}: `{name}!` outside `cli` (only `cli` prints)",
                        file.path
                    ));
                }
            }
        }
        if !matches!(top, Some("pipeline" | "entities")) {
            problems.extend(records_writes(&file.path, &scan));
        }
        if let Some(face @ ("cli" | "api")) = top {
            problems.extend(database_access(face, &file.path, &scan));
        }
        scanned.push((file.path.as_str(), module, scan));
    }
    // The Layers table orders the top-level modules, so a cycle can only hide among the
    // files of one of them.
    let tops: BTreeSet<&[String]> = scanned
        .iter()
        .filter(|(_, module, _)| !module.is_empty())
        .map(|(_, module, _)| &module[..1])
        .collect();
    for top in tops {
        problems.extend(file_cycles(top, &scanned));
    }
    problems
}

/// The import cycles among the top-level modules of a crate that no Layers table orders
/// (`providers`), `source` being its source folder: each module (its files together)
/// imports others only in one direction, so the provider registry in `config` imports the
/// adapters and they never import it back. The crate root is the crate's face: its `pub
/// use`s import nothing, a path through one of them counts as an import of the module the
/// item comes from (`crate::ProviderKind` is `kind`), and its own items (the `Provider`
/// trait) stand below every module.
fn crate_cycles(source: &str, files: &[SourceFile]) -> Vec<String> {
    let mut problems = Vec::new();
    let mut scanned = Vec::new();
    for file in files {
        let module = module_path_in(source, &file.path);
        if module
            .iter()
            .any(|name| name == "tests" || name == "test_support")
        {
            continue;
        }
        match scan::scan(&module, &file.text) {
            Ok(scan) => scanned.push((file.path.as_str(), module, scan)),
            Err(error) => problems.push(format!("{}: cannot be parsed: {error}", file.path)),
        }
    }
    let faces: BTreeMap<String, Vec<String>> = scanned
        .iter()
        .filter(|(_, module, _)| module.is_empty())
        .flat_map(|(_, _, scan)| scan.reexports.iter().cloned())
        .collect();
    for (_, module, scan) in &mut scanned {
        if module.is_empty() {
            scan.ours
                .retain(|(_, path)| !faces.values().any(|target| target == path));
            continue;
        }
        for (_, path) in &mut scan.ours {
            if let Some(target) = path.first().and_then(|name| faces.get(name)) {
                *path = target.iter().chain(&path[1..]).cloned().collect();
            }
        }
    }
    let modules: Vec<&str> = scanned
        .iter()
        .filter_map(|(_, module, _)| module.first().map(String::as_str))
        .collect::<BTreeSet<_>>()
        .into_iter()
        .collect();
    let node = |name: &str| modules.iter().position(|module| *module == name);
    // Each module's imports of the others, with the first file and line of each.
    let mut imports: BTreeMap<usize, BTreeMap<usize, usize>> = BTreeMap::new();
    let mut at: BTreeMap<(usize, usize), (&str, usize)> = BTreeMap::new();
    for (path, module, scan) in &scanned {
        let Some(from) = module.first().and_then(|name| node(name)) else {
            continue;
        };
        let edges = imports.entry(from).or_default();
        for (line, ours) in &scan.ours {
            let Some(to) = ours.first().and_then(|name| node(name)) else {
                continue;
            };
            if to != from && edges.insert(to, *line).is_none() {
                at.insert((from, to), (path, *line));
            }
        }
    }
    let nodes: Vec<usize> = (0..modules.len()).collect();
    for way in cycles(&nodes, &imports) {
        let mut text = String::new();
        for (step, &module) in way.iter().enumerate() {
            let next = way.get(step + 1).copied().unwrap_or(way[0]);
            let (path, line) = at[&(module, next)];
            text.push_str(&format!("`{}` ({path}:{line}) → ", modules[module]));
        }
        text.push_str(&format!("`{}`", modules[way[0]]));
        problems.push(format!("import cycle among the crate's modules: {text}"));
    }
    problems
}

/// The import cycles among the files of module `scope`, one message each: the files it
/// runs through, each with the line where it imports the next
/// (`a.rs:3 → b.rs:7 → a.rs`). A path into a module whose file re-exports the item
/// counts as an import of that file, as the compiler reads it.
fn file_cycles(scope: &[String], scanned: &[(&str, Vec<String>, scan::Scan)]) -> Vec<String> {
    let files: Vec<usize> = (0..scanned.len())
        .filter(|&i| scanned[i].1.starts_with(scope))
        .collect();
    let index: BTreeMap<&[String], usize> = files
        .iter()
        .map(|&i| (scanned[i].1.as_slice(), i))
        .collect();
    // Each file's imports of the scope's other files, with the first line of each.
    let mut imports: BTreeMap<usize, BTreeMap<usize, usize>> = BTreeMap::new();
    for &from in &files {
        let edges = imports.entry(from).or_default();
        for (line, path) in &scanned[from].2.ours {
            if !path.starts_with(scope) {
                continue;
            }
            let to = (scope.len()..=path.len())
                .rev()
                .find_map(|length| index.get(&path[..length]).copied());
            if let Some(to) = to.filter(|to| *to != from) {
                let first = edges.entry(to).or_insert(*line);
                *first = (*first).min(*line);
            }
        }
    }
    cycles(&files, &imports)
        .into_iter()
        .map(|way| {
            let mut text = String::new();
            for (step, &file) in way.iter().enumerate() {
                let next = way.get(step + 1).copied().unwrap_or(way[0]);
                text.push_str(&format!("{}:{} → ", scanned[file].0, imports[&file][&next]));
            }
            text.push_str(scanned[way[0]].0);
            format!("import cycle among `{}`'s files: {text}", scope.join("::"))
        })
        .collect()
}

/// One shortest way round each cycle of the graph `imports` (node to the nodes it
/// imports, each with a line), over `nodes`: the nodes in order, the first one first.
fn cycles(nodes: &[usize], imports: &BTreeMap<usize, BTreeMap<usize, usize>>) -> Vec<Vec<usize>> {
    let reach = |start: usize| -> BTreeSet<usize> {
        let mut seen = BTreeSet::new();
        let mut pending = vec![start];
        while let Some(at) = pending.pop() {
            for &next in imports.get(&at).into_iter().flat_map(BTreeMap::keys) {
                if seen.insert(next) {
                    pending.push(next);
                }
            }
        }
        seen
    };
    let reaches: BTreeMap<usize, BTreeSet<usize>> =
        nodes.iter().map(|&node| (node, reach(node))).collect();
    let mut reported = BTreeSet::new();
    let mut found = Vec::new();
    for &start in nodes {
        if reported.contains(&start) || !reaches[&start].contains(&start) {
            continue;
        }
        // The nodes of `start`'s cycle reach each other; name one shortest way round.
        let circle: BTreeSet<usize> = reaches[&start]
            .iter()
            .copied()
            .filter(|node| reaches.get(node).is_some_and(|r| r.contains(&start)))
            .collect();
        reported.extend(circle.iter().copied());
        let mut came_from = BTreeMap::new();
        let mut queue = VecDeque::from([start]);
        while let Some(at) = queue.pop_front() {
            for &next in imports[&at].keys().filter(|next| circle.contains(next)) {
                if let Entry::Vacant(entry) = came_from.entry(next) {
                    entry.insert(at);
                    queue.push_back(next);
                }
            }
            if came_from.contains_key(&start) {
                break;
            }
        }
        let mut way = vec![start];
        let mut at = start;
        while let Some(&before) = came_from.get(&at) {
            if before == start {
                break;
            }
            way.push(before);
            at = before;
        }
        way.reverse();
        way.rotate_right(1);
        found.push(way);
    }
    found
}

/// Writes to `records` in a file outside the pipeline: a path naming
/// `record::Entity::<write>` or `record::ActiveModel`, or SQL text that inserts into,
/// updates or deletes from `records`.
fn records_writes(path: &str, scan: &scan::Scan) -> Vec<String> {
    let mut problems = Vec::new();
    for (line, segments) in &scan.paths {
        let writes = segments.windows(3).any(|w| {
            w[0] == "record" && w[1] == "Entity" && ENTITY_WRITES.contains(&w[2].as_str())
        }) || segments
            .windows(2)
            .any(|w| w[0] == "record" && w[1] == "ActiveModel");
        if writes {
            problems.push(format!(
                "{path}:{line}: `{}` writes `records` outside `pipeline` (only the pipeline writes `records`)",
                segments.join("::")
            ));
        }
    }
    for (line, text) in &scan.strings {
        let words: Vec<String> = text
            .split(|c: char| !c.is_ascii_alphanumeric() && c != '_')
            .filter(|word| !word.is_empty())
            .map(str::to_ascii_lowercase)
            .collect();
        let writes = words.windows(2).any(|w| {
            matches!(
                (w[0].as_str(), w[1].as_str()),
                ("into" | "update" | "from", "records")
            )
        }) && words
            .iter()
            .any(|word| matches!(word.as_str(), "insert" | "update" | "delete"));
        if writes {
            problems.push(format!(
                "{path}:{line}: SQL that writes `records` outside `pipeline` (only the pipeline writes `records`)"
            ));
        }
    }
    problems
}

/// Database access in a face (`cli`, `api`): a path through a database crate, an entity's
/// `Entity`, or SQL text. The faces call `ops`, which return data.
fn database_access(face: &str, path: &str, scan: &scan::Scan) -> Vec<String> {
    let mut problems = Vec::new();
    for (line, segments) in &scan.paths {
        let through_crate = segments
            .first()
            .is_some_and(|first| DATABASE_PATHS.contains(&first.as_str()));
        if through_crate || segments.iter().any(|segment| segment == "Entity") {
            problems.push(format!(
                "{path}:{line}: `{}` queries the database in `{face}` (call an operation in `ops`)",
                segments.join("::")
            ));
        }
    }
    for (line, text) in &scan.strings {
        let words: Vec<String> = text
            .split(|c: char| !c.is_ascii_alphanumeric() && c != '_')
            .map(str::to_ascii_lowercase)
            .collect();
        let sql = words.iter().any(|w| w == "select") && words.iter().any(|w| w == "from");
        if sql {
            problems.push(format!(
                "{path}:{line}: SQL in `{face}` (call an operation in `ops`)"
            ));
        }
    }
    problems
}

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// Every `.rs` file under `dir`, sorted, with paths relative to the workspace root.
fn source_files(dir: &Path) -> Vec<SourceFile> {
    let mut files = Vec::new();
    let mut pending = vec![dir.to_path_buf()];
    while let Some(dir) = pending.pop() {
        let entries = std::fs::read_dir(&dir).unwrap_or_else(|e| panic!("{dir:?}: {e}"));
        for entry in entries {
            let path = entry.expect("directory entry").path();
            if path.is_dir() {
                pending.push(path);
            } else if path.extension().is_some_and(|ext| ext == "rs") {
                let text = std::fs::read_to_string(&path).expect("source file");
                let shown = path.strip_prefix(root()).unwrap_or(&path);
                files.push(SourceFile {
                    path: shown.display().to_string(),
                    text,
                });
            }
        }
    }
    files.sort_by(|a, b| a.path.cmp(&b.path));
    files
}

fn architecture() -> String {
    std::fs::read_to_string(root().join("ARCHITECTURE.md")).expect("ARCHITECTURE.md")
}

fn layers() -> Layers {
    Layers::parse(&architecture()).unwrap_or_else(|message| panic!("{message}"))
}

fn pipeline_layers() -> Layers {
    Layers::parse_pipeline(&architecture()).unwrap_or_else(|message| panic!("{message}"))
}

/// The modules `file` declares with `mod NAME;`, whatever their visibility, but those
/// compiled for tests only (`#[cfg(test)]` on the line before).
fn declared_modules(file: &str) -> BTreeSet<String> {
    let text = std::fs::read_to_string(root().join(file)).expect("module file");
    let lines: Vec<&str> = text.lines().collect();
    lines
        .iter()
        .enumerate()
        .filter(|(at, _)| *at == 0 || lines[at - 1].trim() != "#[cfg(test)]")
        .map(|(_, line)| *line)
        .filter_map(|line| {
            ["pub mod ", "pub(crate) mod ", "mod "]
                .iter()
                .find_map(|prefix| line.strip_prefix(prefix))
        })
        .filter_map(|rest| rest.strip_suffix(';'))
        .map(str::to_string)
        .collect()
}

#[test]
fn the_source_keeps_the_layers_and_the_invariants() {
    let tables = [&layers(), &pipeline_layers()];
    let problems = check(&tables, &source_files(&root().join("src")));
    assert!(problems.is_empty(), "\n{}\n", problems.join("\n"));
}

#[test]
fn the_providers_crate_has_no_import_cycle() {
    let problems = crate_cycles(
        "providers/src",
        &source_files(&root().join("providers/src")),
    );
    assert!(problems.is_empty(), "\n{}\n", problems.join("\n"));
}

#[test]
fn every_module_of_the_library_has_a_row_and_every_row_a_module() {
    let declared = declared_modules("src/lib.rs");
    let declared: BTreeSet<&str> = declared.iter().map(String::as_str).collect();
    assert_eq!(declared, layers().modules());
}

#[test]
fn every_module_of_the_pipeline_has_a_row_and_every_row_a_module() {
    let declared = declared_modules("src/pipeline/mod.rs");
    let declared: BTreeSet<&str> = declared.iter().map(String::as_str).collect();
    assert_eq!(declared, pipeline_layers().modules());
}

/// Issue 32's aim: fewer public items than this reachable from the crate root.
const PUBLIC_ITEMS_AIM: usize = 80;

/// The most public items the library may have today: it only comes down, towards
/// [`PUBLIC_ITEMS_AIM`], as items become `pub(crate)`.
const PUBLIC_ITEMS_CEILING: usize = 79;

#[test]
fn the_library_has_no_more_public_items_than_its_ceiling() {
    let files: BTreeMap<String, String> = source_files(&root().join("src"))
        .into_iter()
        .map(|file| (file.path, file.text))
        .collect();
    let items = public_items(&files);
    assert!(
        items.len() <= PUBLIC_ITEMS_CEILING,
        "{} public items reachable from the crate root, above the ceiling of {} (the aim: \
         fewer than {}); make the new ones `pub(crate)`:\n{}",
        items.len(),
        PUBLIC_ITEMS_CEILING,
        PUBLIC_ITEMS_AIM,
        items.join("\n")
    );
}

#[test]
fn the_providers_crate_cannot_reach_the_database() {
    let manifest = std::fs::read_to_string(root().join("providers/Cargo.toml")).expect("manifest");
    let manifest: toml::Table = manifest.parse().expect("providers/Cargo.toml is TOML");
    let mut named = Vec::new();
    for table in ["dependencies", "dev-dependencies", "build-dependencies"] {
        if let Some(dependencies) = manifest.get(table).and_then(toml::Value::as_table) {
            named.extend(dependencies.keys().cloned());
        }
    }
    let reaching: Vec<&String> = named
        .iter()
        .filter(|name| DATABASE_CRATES.contains(&name.as_str()))
        .collect();
    assert!(reaching.is_empty(), "providers depends on {reaching:?}");
}

#[test]
fn every_module_with_a_folder_has_its_root_in_the_folder() {
    let mut beside = Vec::new();
    for source in ["src", "providers/src", "migrations/src", "bench/src"] {
        for file in source_files(&root().join(source)) {
            if root().join(&file.path).with_extension("").is_dir() {
                beside.push(file.path);
            }
        }
    }
    assert!(
        beside.is_empty(),
        "NAME.rs beside a folder NAME/ (the crates' layout is NAME/mod.rs): {beside:?}"
    );
}

/// The checker itself, on a small tree with a line `config → db → cli`.
mod checker {
    use super::*;

    const TABLE: &str = "# A\n\n## Layers\n\n| Module | May import |\n|---|---|\n| `config` | — |\n| `db` | `config` |\n| `cli` | `config`, `db` |\n\n## Next\n";

    fn files(files: &[(&str, &str)]) -> Vec<SourceFile> {
        files
            .iter()
            .map(|(path, text)| SourceFile {
                path: path.to_string(),
                text: text.to_string(),
            })
            .collect()
    }

    fn problems(sources: &[(&str, &str)]) -> Vec<String> {
        let layers = Layers::parse(TABLE).expect("table");
        check(&[&layers], &files(sources))
    }

    /// The pipeline's table of a small tree: `ground → store → run`.
    const PIPELINE_TABLE: &str = "## Pipeline layers\n\n| Module | May import |\n|---|---|\n| `ground` | — |\n| `store` | `ground` |\n| `run` | `ground`, `store` |\n";

    fn pipeline_problems(sources: &[(&str, &str)]) -> Vec<String> {
        let layers = Layers::parse_pipeline(PIPELINE_TABLE).expect("table");
        check(&[&layers], &files(sources))
    }

    #[test]
    fn edges_down_the_line_pass() {
        let found = problems(&[
            (
                "src/config.rs",
                "pub struct Settings;\nmod tests { use super::*; }\n",
            ),
            (
                "src/db/mod.rs",
                "use crate::config::Settings;\nmod pools;\n",
            ),
            (
                "src/db/pools.rs",
                "use super::super::config::Settings;\nuse super::X;\n",
            ),
            (
                "src/cli/mod.rs",
                "use crate::{config, db::X};\nfn f() { println!(\"{}\", crate::db::y()); }\n",
            ),
        ]);
        assert_eq!(found, Vec::<String>::new());
    }

    #[test]
    fn a_back_edge_fails_naming_file_line_and_edge() {
        let found = problems(&[("src/config.rs", "//! Settings.\n\nuse crate::cli;\n")]);
        assert_eq!(
            found,
            ["src/config.rs:3: `config` imports `cli`, which ARCHITECTURE.md's Layers table does not allow"]
        );
    }

    #[test]
    fn grouped_uses_super_chains_and_macro_bodies_are_read() {
        let found = problems(&[
            ("src/db/mod.rs", "use crate::{config::A, cli::{B, C}};\n"),
            ("src/db/pools.rs", "\nuse super::super::cli::X;\n"),
            (
                "src/db/lane.rs",
                "fn f() {\n    tracing::info!(x = ?crate::cli::y());\n}\nmod tests {\n    use super::super::super::cli;\n}\n",
            ),
            ("src/config.rs", "fn f() -> crate::db::Pools { todo() }\n"),
        ]);
        assert_eq!(
            found,
            [
                "src/db/mod.rs:1: `db` imports `cli`, which ARCHITECTURE.md's Layers table does not allow",
                "src/db/pools.rs:2: `db` imports `cli`, which ARCHITECTURE.md's Layers table does not allow",
                "src/db/lane.rs:2: `db` imports `cli`, which ARCHITECTURE.md's Layers table does not allow",
                "src/db/lane.rs:5: `db` imports `cli`, which ARCHITECTURE.md's Layers table does not allow",
                "src/config.rs:1: `config` imports `db`, which ARCHITECTURE.md's Layers table does not allow",
            ]
        );
    }

    #[test]
    fn a_table_row_that_names_a_row_below_it_fails() {
        let table = "## Layers\n\n| `config` | `db` |\n| `db` | `config` |\n";
        let layers = Layers::parse(table).expect("table");
        assert_eq!(
            check(&[&layers], &[]),
            ["ARCHITECTURE.md, Layers: `config` may import `db`, which is not a row above it"]
        );
    }

    #[test]
    fn edges_down_the_pipeline_pass() {
        let found = pipeline_problems(&[
            (
                "src/pipeline/mod.rs",
                "mod run;\nuse run::X;\nuse crate::pipeline::store::Y;\n",
            ),
            (
                "src/pipeline/store/mod.rs",
                "mod sqlite;\nuse crate::pipeline::ground::Counts;\nuse super::ground::names;\n",
            ),
            (
                "src/pipeline/store/sqlite.rs",
                "use super::PageContext;\nuse super::super::ground::names;\nuse crate::db::X;\n",
            ),
            (
                "src/pipeline/run.rs",
                "use super::{ground, store::store_page};\nmod tests { use super::*; }\n",
            ),
            ("src/pipeline/ground/mod.rs", "pub struct Counts;\n"),
        ]);
        assert_eq!(found, Vec::<String>::new());
    }

    #[test]
    fn a_back_edge_inside_the_pipeline_fails_naming_file_line_and_edge() {
        let found = pipeline_problems(&[
            (
                "src/pipeline/store/backend.rs",
                "//! The seam.\n\nuse super::super::run::RunCounts;\n",
            ),
            (
                "src/pipeline/ground/mod.rs",
                "fn f() {\n    super::store::begin();\n}\n",
            ),
        ]);
        assert_eq!(
            found,
            [
                "src/pipeline/store/backend.rs:3: `store` imports `run`, which ARCHITECTURE.md's Pipeline layers table does not allow",
                "src/pipeline/ground/mod.rs:2: `ground` imports `store`, which ARCHITECTURE.md's Pipeline layers table does not allow",
            ]
        );
    }

    #[test]
    fn an_item_of_the_pipelines_mod_rs_is_above_every_row_and_a_file_needs_a_row() {
        let found = pipeline_problems(&[
            (
                "src/pipeline/run.rs",
                "use super::RunFault;\nfn f(_: crate::pipeline::Fence) {}\n",
            ),
            ("src/pipeline/walk.rs", "use super::store::X;\n"),
        ]);
        assert_eq!(
            found,
            [
                "src/pipeline/run.rs:1: `run` imports `pipeline`, which ARCHITECTURE.md's Pipeline layers table does not allow",
                "src/pipeline/run.rs:2: `run` imports `pipeline`, which ARCHITECTURE.md's Pipeline layers table does not allow",
                "src/pipeline/walk.rs: module `walk` has no row in ARCHITECTURE.md's Pipeline layers table",
            ]
        );
    }

    #[test]
    fn a_cycle_among_the_pipelines_files_fails_naming_files_and_lines() {
        let found = pipeline_problems(&[
            (
                "src/pipeline/store/mod.rs",
                "mod append;\nmod backend;\nuse append::NewKeys;\npub struct PageChanges;\n",
            ),
            (
                "src/pipeline/store/append.rs",
                "\nuse super::PageChanges;\n",
            ),
            ("src/pipeline/store/backend.rs", "use super::append::X;\n"),
        ]);
        assert_eq!(
            found,
            ["import cycle among `pipeline`'s files: src/pipeline/store/mod.rs:3 → src/pipeline/store/append.rs:2 → src/pipeline/store/mod.rs"]
        );
    }

    #[test]
    fn a_cycle_among_the_files_of_any_module_fails_naming_files_and_lines() {
        let found = problems(&[
            (
                "src/db/mod.rs",
                "mod paths;\nmod lock;\npub use lock::Lock;\npub fn sqlite_file() {}\n",
            ),
            ("src/db/lock.rs", "\n\nuse super::sqlite_file;\n"),
            ("src/db/paths.rs", "use super::lock::Lock;\n"),
            ("src/config/mod.rs", "mod notify;\npub fn redact() {}\n"),
            (
                "src/config/notify.rs",
                "fn f() {\n    super::redact();\n}\n",
            ),
        ]);
        assert_eq!(
            found,
            ["import cycle among `db`'s files: src/db/mod.rs:3 → src/db/lock.rs:3 → src/db/mod.rs"]
        );
    }

    /// A provider registry of a second crate: `config` imports the adapter, the adapter
    /// imports `ProviderKind` through the crate root's re-export.
    fn registry(kind_in: &str) -> Vec<SourceFile> {
        let root = format!(
            "pub mod config;\npub mod github;\nmod kind;\npub use {kind_in}::ProviderKind;\npub trait Provider {{}}\n"
        );
        let kind = "pub trait ProviderKind {}\n";
        let (config, kind) = match kind_in {
            "config" => (format!("use crate::github::GithubConfig;\n{kind}"), ""),
            _ => ("use crate::github::GithubConfig;\n".to_string(), kind),
        };
        files(&[
            ("providers/src/lib.rs", root.as_str()),
            ("providers/src/config.rs", config.as_str()),
            ("providers/src/kind.rs", kind),
            (
                "providers/src/github/mod.rs",
                "mod streams;\nuse crate::{Provider, ProviderKind};\nuse streams::X;\n",
            ),
            (
                "providers/src/github/streams.rs",
                "use super::GithubConfig;\n",
            ),
        ])
    }

    #[test]
    fn a_cycle_among_another_crates_modules_fails_through_its_roots_reexports() {
        assert_eq!(
            crate_cycles("providers/src", &registry("kind")),
            Vec::<String>::new()
        );
        assert_eq!(
            crate_cycles("providers/src", &registry("config")),
            ["import cycle among the crate's modules: `config` (providers/src/config.rs:1) → `github` (providers/src/github/mod.rs:2) → `config`"]
        );
    }

    #[test]
    fn printing_outside_cli_fails() {
        let found = problems(&[(
            "src/db/mod.rs",
            "fn f() {\n    tokio::spawn(async { eprintln!(\"x\") });\n    println!();\n}\n",
        )]);
        assert_eq!(
            found,
            [
                "src/db/mod.rs:2: `eprintln!` outside `cli` (only `cli` prints)",
                "src/db/mod.rs:3: `println!` outside `cli` (only `cli` prints)",
            ]
        );
    }

    #[test]
    fn querying_the_database_in_cli_fails() {
        let found = problems(&[(
            "src/cli/runs.rs",
            "use sea_orm::EntityTrait;\nfn f() {\n    sync_run::Entity::find();\n    let q = \"SELECT id FROM sync_runs\";\n}\n",
        )]);
        assert_eq!(found.len(), 3, "{found:#?}");
        assert!(found[0].starts_with("src/cli/runs.rs:1: `sea_orm::EntityTrait`"));
        assert!(found[1].starts_with("src/cli/runs.rs:3: `sync_run::Entity::find`"));
        assert!(found[2].starts_with("src/cli/runs.rs:4: SQL in `cli`"));
        assert!(problems(&[("src/db.rs", "fn f() { sync_run::Entity::find(); }\n")]).is_empty());
        let found = problems(&[("src/api/runs.rs", "fn f() { sync_run::Entity::find(); }\n")]);
        assert!(
            found.iter().any(|problem| problem
                .contains("runs.rs:1: `sync_run::Entity::find` queries the database in `api`")),
            "{found:?}"
        );
    }

    #[test]
    fn writing_records_outside_the_pipeline_fails() {
        let found = problems(&[(
            "src/db.rs",
            "fn f() {\n    record::Entity::delete_many();\n    let _ = record::Entity::find();\n    db.execute_unprepared(\"DELETE FROM records WHERE id = 1\");\n    let a = record::ActiveModel { ..Default::default() };\n}\n",
        )]);
        assert_eq!(
            found,
            [
                "src/db.rs:2: `record::Entity::delete_many` writes `records` outside `pipeline` (only the pipeline writes `records`)",
                "src/db.rs:5: `record::ActiveModel` writes `records` outside `pipeline` (only the pipeline writes `records`)",
                "src/db.rs:4: SQL that writes `records` outside `pipeline` (only the pipeline writes `records`)",
            ]
        );
    }
}

/// Every test ARCHITECTURE.md names as an invariant's proof (`module::test_name`) exists:
/// a renamed or moved test cannot leave an invariant pointing at nothing.
#[test]
fn every_test_architecture_md_names_exists() {
    let mut defined = BTreeSet::new();
    for dir in ["src", "tests", "bench", "providers"] {
        for file in source_files(&root().join(dir)) {
            for line in file.text.lines() {
                let line = line.trim_start();
                let rest = line
                    .strip_prefix("async fn ")
                    .or_else(|| line.strip_prefix("fn "));
                if let Some(name) = rest.and_then(|rest| rest.split('(').next()) {
                    defined.insert(name.to_string());
                }
            }
        }
    }
    let text = architecture();
    let missing: Vec<&str> = text
        .split('`')
        .skip(1)
        .step_by(2)
        .filter(|quoted| quoted.contains("::"))
        .filter(|quoted| {
            let name = quoted.rsplit("::").next().unwrap_or_default();
            // A test's name is a sentence; an item's is a word or two.
            name.matches('_').count() >= 4
                && name
                    .chars()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_')
        })
        .filter(|quoted| !defined.contains(quoted.rsplit("::").next().unwrap_or_default()))
        .collect();
    assert!(
        missing.is_empty(),
        "ARCHITECTURE.md names tests that do not exist: {missing:?}"
    );
}

/// The most words each document may hold, counted as `wc -w` counts them: written for
/// the reader who arrives today, not as a diary.
const DOCUMENT_WORDS: [(&str, usize); 2] = [("ARCHITECTURE.md", 3_000), ("README.md", 2_500)];

#[test]
fn the_architecture_and_the_readme_stay_within_their_word_counts() {
    let mut over = Vec::new();
    for (document, most) in DOCUMENT_WORDS {
        let text = std::fs::read_to_string(root().join(document)).expect("document");
        let words = text.split_whitespace().count();
        if words > most {
            over.push(format!("{document} has {words} words, more than {most}"));
        }
    }
    assert!(over.is_empty(), "{over:?}; cut elsewhere before adding");
}

/// The notes `docs/decisions/README.md` links to, and the notes in the folder.
fn decision_notes() -> (BTreeSet<String>, BTreeSet<String>) {
    let dir = root().join("docs/decisions");
    let index = std::fs::read_to_string(dir.join("README.md")).expect("docs/decisions/README.md");
    let linked = index
        .split("](")
        .skip(1)
        .filter_map(|rest| rest.split(')').next())
        .filter(|target| !target.contains('/') && target.ends_with(".md"))
        .map(str::to_string)
        .collect();
    let present = std::fs::read_dir(&dir)
        .expect("docs/decisions")
        .filter_map(|entry| entry.ok())
        .map(|entry| entry.file_name().to_string_lossy().into_owned())
        .filter(|name| name.ends_with(".md") && name != "README.md")
        .collect();
    (linked, present)
}

#[test]
fn every_decision_note_is_in_the_index_and_every_entry_is_a_note() {
    let (linked, present) = decision_notes();
    let unlisted: Vec<&String> = present.difference(&linked).collect();
    let dangling: Vec<&String> = linked.difference(&present).collect();
    assert!(
        unlisted.is_empty() && dangling.is_empty(),
        "docs/decisions/README.md lacks {unlisted:?} and links to missing {dangling:?}"
    );
}
