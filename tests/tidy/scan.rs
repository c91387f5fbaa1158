//! Reading one source file: the paths of ours it names, the macros it calls, and the
//! paths and strings that write `records`. Parsed with `syn`, so comments, doc links and
//! strings never count as imports, and a `super::` is resolved from the module it is
//! written in. Test code sits outside the layers, as `tests/` does: an inline
//! `#[cfg(test)] mod` is not read.

use proc_macro2::{Span, TokenStream, TokenTree};
use syn::visit::Visit;

/// What one file's code names.
#[derive(Debug, Default)]
pub struct Scan {
    /// Each path of ours, resolved from the crate root, with the line: `crate::db::X`,
    /// each path of `use crate::{db, sync::Y}`, a `super::` or `self::` path
    /// (`["pipeline", "run", "X"]` for `super::run::X` in `src/pipeline/store.rs`), or a
    /// path through a module the file declares (`backend::X` beside `mod backend;`).
    pub ours: Vec<(usize, Vec<String>)>,
    /// Each macro called (its last path segment), with the line, macros inside macros included.
    pub macros: Vec<(usize, String)>,
    /// Each path of two or more segments, as written (`record::Entity::delete_many`).
    pub paths: Vec<(usize, Vec<String>)>,
    /// Each string literal, with the line.
    pub strings: Vec<(usize, String)>,
    /// Each name a top-level `pub use` of the file makes visible in its module, with the
    /// path of ours it stands for, resolved from the crate root (`ProviderKind` for
    /// `["kind", "ProviderKind"]`).
    pub reexports: Vec<(String, Vec<String>)>,
}

/// Scans `source`, the file of module `module` (`["pipeline", "store"]` for
/// `src/pipeline/store.rs`, empty for `src/lib.rs`).
pub fn scan(module: &[String], source: &str) -> syn::Result<Scan> {
    let file = syn::parse_file(source)?;
    let mut visitor = Visitor {
        file_module: module.to_vec(),
        module: module.to_vec(),
        children: Vec::new(),
        relative: Vec::new(),
        reexports: Vec::new(),
        scan: Scan::default(),
    };
    visitor.visit_file(&file);
    let Visitor {
        file_module,
        children,
        relative,
        reexports,
        mut scan,
        ..
    } = visitor;
    for (name, segments) in reexports {
        let resolved = match segments.first().map(String::as_str) {
            Some("crate") => Some(segments[1..].to_vec()),
            Some("self") => Some([file_module.as_slice(), &segments[1..]].concat()),
            Some("super") => {
                let rest = segments.iter().skip_while(|s| *s == "super");
                let up = segments.len() - rest.clone().count();
                let keep = file_module.len().saturating_sub(up);
                Some(file_module[..keep].iter().chain(rest).cloned().collect())
            }
            Some(first) if children.iter().any(|child| child == first) => {
                Some([file_module.as_slice(), &segments].concat())
            }
            _ => None,
        };
        if let Some(resolved) = resolved {
            scan.reexports.push((name, resolved));
        }
    }
    for (line, segments) in relative {
        if segments
            .first()
            .is_some_and(|first| children.contains(first))
        {
            let mut resolved = file_module.clone();
            resolved.extend(segments);
            scan.ours.push((line, resolved));
        }
    }
    scan.ours.sort_by_key(|(line, _)| *line);
    Ok(scan)
}

struct Visitor {
    /// The module the file is.
    file_module: Vec<String>,
    /// The module being read: the file's, or an inline module in it.
    module: Vec<String>,
    /// The modules the file declares (`mod backend;`).
    children: Vec<String>,
    /// Paths written in the file's own module that start with neither `crate`, `super`
    /// nor `self`; those that start with a declared module are ours.
    relative: Vec<(usize, Vec<String>)>,
    /// The names the file's top-level `pub use`s make visible, with the paths as written.
    reexports: Vec<(String, Vec<String>)>,
    scan: Scan,
}

fn line(span: Span) -> usize {
    span.start().line
}

impl Visitor {
    /// Records the path of ours that `segments` names, resolved from the crate root, if it
    /// starts at the crate root or the module it is written in.
    fn reference(&mut self, line: usize, segments: &[String]) {
        let Some(first) = segments.first() else {
            return;
        };
        let resolved = match first.as_str() {
            "crate" => segments[1..].to_vec(),
            "super" | "self" => {
                let mut module = self.module.clone();
                let mut rest = segments;
                while let Some(head) = rest.first() {
                    match head.as_str() {
                        "super" => {
                            module.pop();
                        }
                        "self" => {}
                        _ => break,
                    }
                    rest = &rest[1..];
                }
                module.extend_from_slice(rest);
                module
            }
            _ => {
                // One segment alone is as likely a local variable as a module.
                if self.module == self.file_module && segments.len() > 1 {
                    self.relative.push((line, segments.to_vec()));
                }
                return;
            }
        };
        if !resolved.is_empty() {
            self.scan.ours.push((line, resolved));
        }
    }

    fn path(&mut self, line: usize, segments: Vec<String>) {
        self.reference(line, &segments);
        if segments.len() > 1 {
            self.scan.paths.push((line, segments));
        }
    }

    /// Every path of a `use` tree, groups expanded.
    fn use_tree(&mut self, prefix: &mut Vec<String>, tree: &syn::UseTree) {
        match tree {
            syn::UseTree::Path(path) => {
                prefix.push(path.ident.to_string());
                self.use_tree(prefix, &path.tree);
                prefix.pop();
            }
            syn::UseTree::Name(name) => {
                let mut segments = prefix.clone();
                segments.push(name.ident.to_string());
                self.path(line(name.ident.span()), segments);
            }
            syn::UseTree::Rename(rename) => {
                let mut segments = prefix.clone();
                segments.push(rename.ident.to_string());
                self.path(line(rename.ident.span()), segments);
            }
            syn::UseTree::Glob(glob) => {
                let mut segments = prefix.clone();
                segments.push("*".to_string());
                self.path(line(glob.star_token.span), segments);
            }
            syn::UseTree::Group(group) => {
                for tree in &group.items {
                    self.use_tree(prefix, tree);
                }
            }
        }
    }

    /// A macro's tokens are not parsed, so paths and nested macro calls are found in the
    /// token stream: `a::b::c` sequences and `name!`.
    fn tokens(&mut self, tokens: TokenStream) {
        let tokens: Vec<TokenTree> = tokens.into_iter().collect();
        let mut i = 0;
        while i < tokens.len() {
            match &tokens[i] {
                TokenTree::Group(group) => self.tokens(group.stream()),
                TokenTree::Literal(literal) => {
                    if let Ok(syn::Lit::Str(text)) =
                        syn::parse_str::<syn::Lit>(&literal.to_string())
                    {
                        self.scan.strings.push((line(literal.span()), text.value()));
                    }
                }
                TokenTree::Ident(ident) => {
                    let after_path_separator = i >= 2 && is_punct(&tokens[i - 1], ':');
                    if is_punct_at(&tokens, i + 1, '!') {
                        self.scan
                            .macros
                            .push((line(ident.span()), ident.to_string()));
                    } else if !after_path_separator {
                        let mut segments = vec![ident.to_string()];
                        let mut next = i + 1;
                        while is_punct_at(&tokens, next, ':') && is_punct_at(&tokens, next + 1, ':')
                        {
                            let Some(TokenTree::Ident(segment)) = tokens.get(next + 2) else {
                                break;
                            };
                            segments.push(segment.to_string());
                            next += 3;
                        }
                        self.path(line(ident.span()), segments);
                        i = next;
                        continue;
                    }
                }
                TokenTree::Punct(_) => {}
            }
            i += 1;
        }
    }
}

fn is_punct(token: &TokenTree, ch: char) -> bool {
    matches!(token, TokenTree::Punct(punct) if punct.as_char() == ch)
}

fn is_punct_at(tokens: &[TokenTree], at: usize, ch: char) -> bool {
    tokens.get(at).is_some_and(|token| is_punct(token, ch))
}

impl<'ast> Visit<'ast> for Visitor {
    // Attributes are skipped: doc comments are prose, and derive and serde arguments
    // name no module of ours.
    fn visit_attribute(&mut self, _attribute: &'ast syn::Attribute) {}

    // `pub(super)` and `pub(in crate::x)` say who may see an item, not what it imports.
    fn visit_visibility(&mut self, _visibility: &'ast syn::Visibility) {}

    fn visit_item_mod(&mut self, item: &'ast syn::ItemMod) {
        if is_test_only(&item.attrs) {
            return;
        }
        if item.content.is_some() {
            self.module.push(item.ident.to_string());
            syn::visit::visit_item_mod(self, item);
            self.module.pop();
        } else if self.module == self.file_module {
            self.children.push(item.ident.to_string());
        }
    }

    fn visit_item_use(&mut self, item: &'ast syn::ItemUse) {
        self.use_tree(&mut Vec::new(), &item.tree);
        let public = !matches!(item.vis, syn::Visibility::Inherited);
        if public && self.module == self.file_module {
            reexports(&mut Vec::new(), &item.tree, &mut self.reexports);
        }
    }

    fn visit_path(&mut self, path: &'ast syn::Path) {
        let segments = path.segments.iter().map(|s| s.ident.to_string()).collect();
        let at = path
            .segments
            .first()
            .map_or(0, |segment| line(segment.ident.span()));
        self.path(at, segments);
        syn::visit::visit_path(self, path);
    }

    fn visit_macro(&mut self, mac: &'ast syn::Macro) {
        if let Some(name) = mac.path.segments.last() {
            self.scan
                .macros
                .push((line(name.ident.span()), name.ident.to_string()));
        }
        self.tokens(mac.tokens.clone());
        syn::visit::visit_macro(self, mac);
    }

    fn visit_lit_str(&mut self, literal: &'ast syn::LitStr) {
        self.scan
            .strings
            .push((line(literal.span()), literal.value()));
    }
}

/// The names a `use` tree makes visible, each with the path it stands for; a glob names
/// none.
fn reexports(
    prefix: &mut Vec<String>,
    tree: &syn::UseTree,
    found: &mut Vec<(String, Vec<String>)>,
) {
    match tree {
        syn::UseTree::Path(path) => {
            prefix.push(path.ident.to_string());
            reexports(prefix, &path.tree, found);
            prefix.pop();
        }
        syn::UseTree::Name(name) => {
            let mut segments = prefix.clone();
            segments.push(name.ident.to_string());
            found.push((name.ident.to_string(), segments));
        }
        syn::UseTree::Rename(rename) => {
            let mut segments = prefix.clone();
            segments.push(rename.ident.to_string());
            found.push((rename.rename.to_string(), segments));
        }
        syn::UseTree::Glob(_) => {}
        syn::UseTree::Group(group) => {
            for tree in &group.items {
                reexports(prefix, tree, found);
            }
        }
    }
}

/// Whether `attrs` hold `#[cfg(test)]`.
fn is_test_only(attrs: &[syn::Attribute]) -> bool {
    attrs.iter().any(|attr| {
        attr.path().is_ident("cfg")
            && attr
                .parse_args::<syn::Ident>()
                .is_ok_and(|ident| ident == "test")
    })
}
