//! Which file of a crate uses which: the graph the "no import circle" rule checks.
//!
//! File A depends on file B when code in A, outside `#[cfg(test)]` items, names an item
//! *defined* in B: through `use crate::…`, `use super::…`, a child module's path, or a path
//! written inline. A `pub` or `pub(crate)` `use` is an alias, not an edge: a path through it
//! is followed to the file that defines the item. `mod x;` declarations are not edges.
//!
//! The resolution is name-based and deliberately simple (no macro expansion, no glob
//! resolution beyond the module it names): it only has to be exact for the paths this
//! project writes, and the tests below pin what it understands.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use syn::visit::Visit;

/// A module of the crate: where it is written, and what its names mean.
#[derive(Debug, Default)]
struct Module {
    file: PathBuf,
    /// Child modules by name (file-backed or inline).
    children: BTreeMap<String, String>,
    /// Names bound by `use` in this module, with the path they stand for.
    aliases: BTreeMap<String, Alias>,
    /// Modules named by a glob import (`use a::b::*`).
    globs: Vec<Vec<String>>,
}

#[derive(Debug, Clone)]
struct Alias {
    path: Vec<String>,
}

/// One use of another file: where it is written and the path it names.
#[derive(Debug, Clone)]
struct Reference {
    module: String,
    path: Vec<String>,
}

/// An edge of the graph, with one path that caused it (for the error message).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Edge {
    pub from: PathBuf,
    pub to: PathBuf,
    pub because: String,
}

/// The file-level dependency graph of the crate whose root file is `root` (a `lib.rs` or
/// `main.rs`). `read` gives a file's text (the real file system, or a map in tests).
pub fn crate_edges(root: &Path, read: &dyn Fn(&Path) -> Result<String>) -> Result<Vec<Edge>> {
    let mut modules: BTreeMap<String, Module> = BTreeMap::new();
    let mut references = Vec::new();
    load_file(
        root,
        String::new(),
        true,
        read,
        &mut modules,
        &mut references,
    )?;
    let mut edges: Vec<Edge> = Vec::new();
    for reference in &references {
        let Some(from) = modules.get(&reference.module).map(|m| m.file.clone()) else {
            continue;
        };
        let Some(target) = resolve(&modules, &reference.module, &reference.path, 0) else {
            continue;
        };
        let Some(to) = modules.get(&target).map(|m| m.file.clone()) else {
            continue;
        };
        if from != to && !edges.iter().any(|e| e.from == from && e.to == to) {
            edges.push(Edge {
                from,
                to,
                because: reference.path.join("::"),
            });
        }
    }
    Ok(edges)
}

/// Reads one file-backed module (and its inline modules), then the files of the modules it
/// declares.
fn load_file(
    file: &Path,
    module: String,
    owns_directory: bool,
    read: &dyn Fn(&Path) -> Result<String>,
    modules: &mut BTreeMap<String, Module>,
    references: &mut Vec<Reference>,
) -> Result<()> {
    let text = read(file)?;
    let parsed = syn::parse_file(&text).with_context(|| format!("parsing {}", file.display()))?;
    // Where `mod x;` looks for `x.rs`: beside a `mod.rs`/`lib.rs`/`main.rs`, else in a
    // folder named after the file.
    let dir = if owns_directory {
        file.parent().map(Path::to_path_buf).unwrap_or_default()
    } else {
        let stem = file.file_stem().map(|s| s.to_owned()).unwrap_or_default();
        file.parent().map(|p| p.join(stem)).unwrap_or_default()
    };
    let mut declared = Vec::new();
    load_items(
        &parsed.items,
        file,
        &module,
        modules,
        references,
        &mut declared,
    );
    for (child_module, name, explicit) in declared {
        let child_file = match explicit {
            Some(path) => file.parent().unwrap_or(Path::new("")).join(path),
            None => {
                let flat = dir.join(format!("{name}.rs"));
                if read(&flat).is_ok() {
                    flat
                } else {
                    dir.join(&name).join("mod.rs")
                }
            }
        };
        let owns = child_file.file_name().is_some_and(|n| n == "mod.rs");
        load_file(&child_file, child_module, owns, read, modules, references)?;
    }
    Ok(())
}

/// Records the module's names and the paths its items use; returns (through `declared`) the
/// file-backed child modules still to read.
fn load_items(
    items: &[syn::Item],
    file: &Path,
    module: &str,
    modules: &mut BTreeMap<String, Module>,
    references: &mut Vec<Reference>,
    declared: &mut Vec<(String, String, Option<String>)>,
) {
    let entry = modules.entry(module.to_owned()).or_default();
    entry.file = file.to_path_buf();
    for item in items {
        if is_test_only(item_attrs(item)) {
            continue;
        }
        match item {
            syn::Item::Mod(child) => {
                let name = child.ident.to_string();
                let child_module = join(module, &name);
                modules
                    .entry(module.to_owned())
                    .or_default()
                    .children
                    .insert(name.clone(), child_module.clone());
                match &child.content {
                    Some((_, inner)) => {
                        load_items(inner, file, &child_module, modules, references, declared);
                    }
                    None => declared.push((child_module, name, path_attr(&child.attrs))),
                }
            }
            syn::Item::Use(item_use) => {
                let reexport = !matches!(item_use.vis, syn::Visibility::Inherited);
                let mut flat = Vec::new();
                flatten_use(&item_use.tree, Vec::new(), &mut flat);
                let here = modules.entry(module.to_owned()).or_default();
                for (path, binding) in flat {
                    match binding {
                        Binding::Name(name) => {
                            here.aliases.insert(name, Alias { path: path.clone() });
                        }
                        Binding::Glob => here.globs.push(path.clone()),
                        Binding::Hidden => {}
                    }
                    // A private import is a use of what it names; a re-export is only an
                    // alias, followed where something uses it.
                    if !reexport {
                        references.push(Reference {
                            module: module.to_owned(),
                            path,
                        });
                    }
                }
            }
            other => {
                let mut paths = PathCollector::default();
                paths.visit_item(other);
                references.extend(paths.paths.into_iter().map(|path| Reference {
                    module: module.to_owned(),
                    path,
                }));
            }
        }
    }
}

enum Binding {
    /// `use a::b;` or `use a::b as c;`: the name it binds.
    Name(String),
    /// `use a::b::*;`
    Glob,
    /// `use a::b as _;`: binds nothing (a trait brought into scope).
    Hidden,
}

fn flatten_use(tree: &syn::UseTree, prefix: Vec<String>, out: &mut Vec<(Vec<String>, Binding)>) {
    match tree {
        syn::UseTree::Path(p) => {
            let mut next = prefix;
            next.push(p.ident.to_string());
            flatten_use(&p.tree, next, out);
        }
        syn::UseTree::Name(n) => {
            let name = n.ident.to_string();
            if name == "self" {
                let bound = prefix.last().cloned().unwrap_or_default();
                out.push((prefix, Binding::Name(bound)));
            } else {
                let mut path = prefix;
                path.push(name.clone());
                out.push((path, Binding::Name(name)));
            }
        }
        syn::UseTree::Rename(r) => {
            let mut path = prefix;
            let original = r.ident.to_string();
            if original != "self" {
                path.push(original);
            }
            let binding = if r.rename == "_" {
                Binding::Hidden
            } else {
                Binding::Name(r.rename.to_string())
            };
            out.push((path, binding));
        }
        syn::UseTree::Glob(_) => out.push((prefix, Binding::Glob)),
        syn::UseTree::Group(g) => {
            for tree in &g.items {
                flatten_use(tree, prefix.clone(), out);
            }
        }
    }
}

/// Every multi-segment path, and every single name, written in an item (types,
/// expressions, patterns, bounds, macro names), skipping `#[cfg(test)]` inner items.
#[derive(Default)]
struct PathCollector {
    paths: Vec<Vec<String>>,
}

impl<'ast> Visit<'ast> for PathCollector {
    fn visit_path(&mut self, path: &'ast syn::Path) {
        let segments: Vec<String> = path.segments.iter().map(|s| s.ident.to_string()).collect();
        if !segments.is_empty() {
            self.paths.push(segments);
        }
        syn::visit::visit_path(self, path);
    }

    fn visit_item(&mut self, item: &'ast syn::Item) {
        if !is_test_only(item_attrs(item)) {
            syn::visit::visit_item(self, item);
        }
    }

    fn visit_impl_item_fn(&mut self, function: &'ast syn::ImplItemFn) {
        if !is_test_only(&function.attrs) {
            syn::visit::visit_impl_item_fn(self, function);
        }
    }

    // Attributes (derives, `#[utoipa::path(...)]`) name macros and their arguments, not
    // the code's dependencies.
    fn visit_attribute(&mut self, _attribute: &'ast syn::Attribute) {}

    // `pub(super)` and `pub(in crate::x)` say who may see an item, not what it uses.
    fn visit_visibility(&mut self, _visibility: &'ast syn::Visibility) {}
}

/// The module a path names, starting in `module`; `None` when it leaves the crate (std,
/// a dependency) or names something local that is not an item (a variable).
fn resolve(
    modules: &BTreeMap<String, Module>,
    module: &str,
    path: &[String],
    depth: usize,
) -> Option<String> {
    // Aliases can chain; a crate whose aliases loop is a compile error anyway.
    if depth > 16 || path.is_empty() {
        return None;
    }
    let (mut current, rest) = match path[0].as_str() {
        "crate" => (String::new(), &path[1..]),
        "self" => (module.to_owned(), &path[1..]),
        "super" => {
            let mut current = module.to_owned();
            let mut rest = path;
            while rest.first().is_some_and(|s| s == "super") {
                current = parent(&current)?;
                rest = &rest[1..];
            }
            (current, rest)
        }
        first => {
            let here = modules.get(module)?;
            if let Some(child) = here.children.get(first) {
                (child.clone(), &path[1..])
            } else if let Some(alias) = here.aliases.get(first) {
                let mut target = alias.path.clone();
                target.extend_from_slice(&path[1..]);
                return resolve(modules, module, &target, depth + 1);
            } else {
                // A dependency, the prelude, a local variable or generic, or an item of
                // this very module: none of them is an edge.
                return None;
            }
        }
    };
    let mut rest = rest;
    while let Some(segment) = rest.first() {
        let here = modules.get(&current)?;
        if let Some(child) = here.children.get(segment) {
            current = child.clone();
            rest = &rest[1..];
        } else if let Some(alias) = here.aliases.get(segment) {
            let mut target = alias.path.clone();
            target.extend_from_slice(&rest[1..]);
            return resolve(modules, &current, &target, depth + 1);
        } else {
            // An item defined here (or brought in by a glob: then the glob's module).
            if let Some(glob) = here.globs.first()
                && !defines(here, segment)
            {
                return resolve(modules, &current, glob, depth + 1);
            }
            return Some(current);
        }
    }
    Some(current)
}

/// Whether a module binds `name` itself (a child or an alias); items are not tracked, so a
/// glob is only followed when the module binds nothing else by that name.
fn defines(module: &Module, name: &str) -> bool {
    module.children.contains_key(name) || module.aliases.contains_key(name)
}

fn join(module: &str, name: &str) -> String {
    if module.is_empty() {
        name.to_owned()
    } else {
        format!("{module}::{name}")
    }
}

fn parent(module: &str) -> Option<String> {
    if module.is_empty() {
        return None;
    }
    Some(
        module
            .rsplit_once("::")
            .map_or(String::new(), |(p, _)| p.to_owned()),
    )
}

fn item_attrs(item: &syn::Item) -> &[syn::Attribute] {
    match item {
        syn::Item::Const(i) => &i.attrs,
        syn::Item::Enum(i) => &i.attrs,
        syn::Item::ExternCrate(i) => &i.attrs,
        syn::Item::Fn(i) => &i.attrs,
        syn::Item::ForeignMod(i) => &i.attrs,
        syn::Item::Impl(i) => &i.attrs,
        syn::Item::Macro(i) => &i.attrs,
        syn::Item::Mod(i) => &i.attrs,
        syn::Item::Static(i) => &i.attrs,
        syn::Item::Struct(i) => &i.attrs,
        syn::Item::Trait(i) => &i.attrs,
        syn::Item::TraitAlias(i) => &i.attrs,
        syn::Item::Type(i) => &i.attrs,
        syn::Item::Union(i) => &i.attrs,
        syn::Item::Use(i) => &i.attrs,
        _ => &[],
    }
}

/// `#[cfg(test)]`, or any `cfg` that mentions `test` (e.g. `cfg(all(test, feature = ..))`).
fn is_test_only(attrs: &[syn::Attribute]) -> bool {
    attrs.iter().any(|attr| {
        attr.path().is_ident("cfg")
            && attr
                .meta
                .require_list()
                .is_ok_and(|list| mentions_test(list.tokens.clone()))
    })
}

fn mentions_test(tokens: proc_macro2::TokenStream) -> bool {
    tokens.into_iter().any(|token| match token {
        proc_macro2::TokenTree::Ident(ident) => ident == "test",
        proc_macro2::TokenTree::Group(group) => mentions_test(group.stream()),
        _ => false,
    })
}

/// `#[path = "x.rs"] mod y;`
fn path_attr(attrs: &[syn::Attribute]) -> Option<String> {
    attrs.iter().find_map(|attr| {
        let syn::Meta::NameValue(nv) = &attr.meta else {
            return None;
        };
        if !nv.path.is_ident("path") {
            return None;
        }
        match &nv.value {
            syn::Expr::Lit(syn::ExprLit {
                lit: syn::Lit::Str(s),
                ..
            }) => Some(s.value()),
            _ => None,
        }
    })
}

/// The cycles of a graph: its strongly connected components of more than one file, each
/// sorted, in a stable order.
pub fn cycles(edges: &[Edge]) -> Vec<Vec<PathBuf>> {
    let nodes: BTreeSet<&PathBuf> = edges.iter().flat_map(|e| [&e.from, &e.to]).collect();
    let index: BTreeMap<&PathBuf, usize> = nodes.iter().enumerate().map(|(i, n)| (*n, i)).collect();
    let names: Vec<&PathBuf> = nodes.into_iter().collect();
    let mut adjacent = vec![Vec::new(); names.len()];
    for edge in edges {
        adjacent[index[&edge.from]].push(index[&edge.to]);
    }
    let mut components = tarjan(&adjacent);
    components.retain(|c| c.len() > 1);
    let mut named: Vec<Vec<PathBuf>> = components
        .into_iter()
        .map(|c| {
            let mut files: Vec<PathBuf> = c.into_iter().map(|i| names[i].clone()).collect();
            files.sort();
            files
        })
        .collect();
    named.sort();
    named
}

/// Tarjan's strongly connected components, iteratively (no recursion limit to worry about).
fn tarjan(adjacent: &[Vec<usize>]) -> Vec<Vec<usize>> {
    const UNSEEN: usize = usize::MAX;
    let n = adjacent.len();
    let mut order = vec![UNSEEN; n];
    let mut low = vec![0; n];
    let mut on_stack = vec![false; n];
    let mut stack = Vec::new();
    let mut next = 0;
    let mut components = Vec::new();
    for start in 0..n {
        if order[start] != UNSEEN {
            continue;
        }
        // (node, index of the next neighbour to look at)
        let mut work = vec![(start, 0)];
        order[start] = next;
        low[start] = next;
        next += 1;
        stack.push(start);
        on_stack[start] = true;
        while let Some(&mut (node, ref mut at)) = work.last_mut() {
            if let Some(&neighbour) = adjacent[node].get(*at) {
                *at += 1;
                if order[neighbour] == UNSEEN {
                    order[neighbour] = next;
                    low[neighbour] = next;
                    next += 1;
                    stack.push(neighbour);
                    on_stack[neighbour] = true;
                    work.push((neighbour, 0));
                } else if on_stack[neighbour] {
                    low[node] = low[node].min(order[neighbour]);
                }
                continue;
            }
            work.pop();
            if let Some(&(caller, _)) = work.last() {
                low[caller] = low[caller].min(low[node]);
            }
            if low[node] == order[node] {
                let mut component = Vec::new();
                while let Some(member) = stack.pop() {
                    on_stack[member] = false;
                    component.push(member);
                    if member == node {
                        break;
                    }
                }
                components.push(component);
            }
        }
    }
    components
}

#[cfg(test)]
mod tests {
    use super::*;

    fn edges_of(files: &[(&str, &str)]) -> Vec<(String, String)> {
        let map: BTreeMap<PathBuf, String> = files
            .iter()
            .map(|(p, t)| (PathBuf::from(p), (*t).to_owned()))
            .collect();
        let read = |p: &Path| {
            map.get(p)
                .cloned()
                .with_context(|| format!("no {}", p.display()))
        };
        let mut edges: Vec<(String, String)> = crate_edges(Path::new("src/lib.rs"), &read)
            .unwrap()
            .into_iter()
            .map(|e| (e.from.display().to_string(), e.to.display().to_string()))
            .collect();
        edges.sort();
        edges
    }

    fn edge(from: &str, to: &str) -> (String, String) {
        (from.to_owned(), to.to_owned())
    }

    #[test]
    fn imports_and_inline_paths_are_edges_and_re_exports_are_followed() {
        let edges = edges_of(&[
            (
                "src/lib.rs",
                "pub mod model; pub mod view; pub use model::Limit;",
            ),
            ("src/model.rs", "pub struct Limit;"),
            (
                "src/view.rs",
                "use crate::Limit; pub fn f() -> crate::model::Limit { Limit }",
            ),
        ]);
        // `crate::Limit` goes through lib.rs's re-export to model.rs; lib.rs itself only
        // re-exports, so it depends on nothing.
        assert_eq!(edges, [edge("src/view.rs", "src/model.rs")]);
    }

    #[test]
    fn super_children_folders_and_private_imports_resolve() {
        let edges = edges_of(&[
            ("src/lib.rs", "mod global;"),
            (
                "src/global/mod.rs",
                "mod lease; mod table; const TTL: u64 = 3; use table::Table; fn f(_: Table) {}",
            ),
            ("src/global/lease.rs", "use super::TTL; pub struct Lease;"),
            (
                "src/global/table.rs",
                "use super::lease::Lease; pub struct Table(Lease);",
            ),
        ]);
        assert_eq!(
            edges,
            [
                edge("src/global/lease.rs", "src/global/mod.rs"),
                edge("src/global/mod.rs", "src/global/table.rs"),
                edge("src/global/table.rs", "src/global/lease.rs"),
            ]
        );
    }

    #[test]
    fn test_modules_dependencies_visibility_and_local_names_are_not_edges() {
        let edges = edges_of(&[
            ("src/lib.rs", "mod a; mod b;"),
            (
                "src/a.rs",
                "use std::fmt; pub(crate) struct A; pub(in crate::b) fn f(x: u8) -> u8 { x } \
                 #[cfg(test)] mod tests { use crate::b::B; }",
            ),
            ("src/b.rs", "pub struct B(crate::a::A);"),
        ]);
        assert_eq!(edges, [edge("src/b.rs", "src/a.rs")]);
    }

    #[test]
    fn a_circle_is_one_component_and_a_chain_is_none() {
        let edges = |pairs: &[(&str, &str)]| -> Vec<Edge> {
            pairs
                .iter()
                .map(|(a, b)| Edge {
                    from: PathBuf::from(a),
                    to: PathBuf::from(b),
                    because: String::new(),
                })
                .collect()
        };
        assert!(cycles(&edges(&[("a", "b"), ("b", "c")])).is_empty());
        let found = cycles(&edges(&[("a", "b"), ("b", "c"), ("c", "a"), ("c", "d")]));
        assert_eq!(
            found,
            [vec![
                PathBuf::from("a"),
                PathBuf::from("b"),
                PathBuf::from("c")
            ]]
        );
    }
}
