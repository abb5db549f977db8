//! The `requires` graph of a workflow: finding cycles and a topological order. Both are
//! iterative, so a document with a very long chain of steps cannot overflow the stack.
//!
//! A graph maps each step's name to the names it requires; names that are not steps are
//! ignored here (the validator reports them separately).

use std::collections::{BTreeMap, BTreeSet, VecDeque};

/// Every step, each after all the steps it requires; ready steps are taken by name. Steps on
/// or behind a cycle cannot be ordered and come last, by name.
pub(crate) fn topological_order<'a>(graph: &BTreeMap<&'a str, Vec<&'a str>>) -> Vec<&'a str> {
    let mut waiting_on: BTreeMap<&'a str, usize> = BTreeMap::new();
    let mut dependents: BTreeMap<&'a str, Vec<&'a str>> = BTreeMap::new();
    for (&name, requires) in graph {
        let known: BTreeSet<&'a str> = requires
            .iter()
            .copied()
            .filter(|r| graph.contains_key(r))
            .collect();
        waiting_on.insert(name, known.len());
        for r in known {
            dependents.entry(r).or_default().push(name);
        }
    }
    let mut ready: BTreeSet<&'a str> = waiting_on
        .iter()
        .filter(|(_, n)| **n == 0)
        .map(|(name, _)| *name)
        .collect();
    let mut order = Vec::with_capacity(graph.len());
    while let Some(name) = ready.pop_first() {
        order.push(name);
        for &d in dependents.get(name).into_iter().flatten() {
            if let Some(n) = waiting_on.get_mut(d) {
                *n -= 1;
                if *n == 0 {
                    ready.insert(d);
                }
            }
        }
    }
    if order.len() < graph.len() {
        let placed: BTreeSet<&str> = order.iter().copied().collect();
        let rest: Vec<&'a str> = graph
            .keys()
            .copied()
            .filter(|name| !placed.contains(name))
            .collect();
        order.extend(rest);
    }
    order
}

/// One cycle for each group of steps that require each other, as the list of names along
/// `requires` edges from the group's first name (by name) back to it: `[a, b, c, a]`; a step
/// that requires itself gives `[a, a]`. Reporting one cycle per group (rather than every
/// elementary cycle, which can be exponentially many) names each loop once; fixing it and
/// validating again reveals any other. Sorted by first name.
pub(crate) fn cycles<'a>(graph: &BTreeMap<&'a str, Vec<&'a str>>) -> Vec<Vec<&'a str>> {
    let names: Vec<&'a str> = graph.keys().copied().collect();
    let index: BTreeMap<&str, usize> = names.iter().enumerate().map(|(i, n)| (*n, i)).collect();
    let adjacency: Vec<Vec<usize>> = names
        .iter()
        .map(|name| {
            let mut out: Vec<usize> = Vec::new();
            for r in graph.get(name).into_iter().flatten() {
                if let Some(&i) = index.get(r) {
                    if !out.contains(&i) {
                        out.push(i);
                    }
                }
            }
            out
        })
        .collect();

    let mut found = Vec::new();
    for component in strongly_connected(&adjacency) {
        // Indices follow name order, so the smallest index is the first name.
        let Some(&start) = component.iter().min() else {
            continue;
        };
        let looping = component.len() > 1 || adjacency[start].contains(&start);
        if !looping {
            continue;
        }
        let mut member = vec![false; names.len()];
        for &v in &component {
            member[v] = true;
        }
        if let Some(path) = shortest_cycle(&adjacency, &member, start) {
            found.push(path.into_iter().map(|i| names[i]).collect::<Vec<_>>());
        }
    }
    found.sort();
    found
}

/// Tarjan's algorithm with an explicit stack.
fn strongly_connected(adjacency: &[Vec<usize>]) -> Vec<Vec<usize>> {
    const UNSEEN: usize = usize::MAX;
    let n = adjacency.len();
    let mut index = vec![UNSEEN; n];
    let mut low = vec![0; n];
    let mut on_stack = vec![false; n];
    let mut stack: Vec<usize> = Vec::new();
    let mut next = 0;
    let mut components = Vec::new();
    // Each frame: a node and how many of its edges have been followed.
    let mut frames: Vec<(usize, usize)> = Vec::new();

    for root in 0..n {
        if index[root] != UNSEEN {
            continue;
        }
        index[root] = next;
        low[root] = next;
        next += 1;
        stack.push(root);
        on_stack[root] = true;
        frames.push((root, 0));

        while let Some(frame) = frames.last_mut() {
            let v = frame.0;
            if let Some(&w) = adjacency[v].get(frame.1) {
                frame.1 += 1;
                if index[w] == UNSEEN {
                    index[w] = next;
                    low[w] = next;
                    next += 1;
                    stack.push(w);
                    on_stack[w] = true;
                    frames.push((w, 0));
                } else if on_stack[w] {
                    low[v] = low[v].min(index[w]);
                }
                continue;
            }
            frames.pop();
            if let Some(&(parent, _)) = frames.last() {
                low[parent] = low[parent].min(low[v]);
            }
            if low[v] == index[v] {
                let mut component = Vec::new();
                while let Some(w) = stack.pop() {
                    on_stack[w] = false;
                    component.push(w);
                    if w == v {
                        break;
                    }
                }
                components.push(component);
            }
        }
    }
    components
}

/// Breadth-first search inside one component from `start` back to `start`, following edges
/// in the order they were written, so the reported cycle is short and reads like the file.
fn shortest_cycle(adjacency: &[Vec<usize>], member: &[bool], start: usize) -> Option<Vec<usize>> {
    let mut parent = vec![usize::MAX; adjacency.len()];
    let mut seen = vec![false; adjacency.len()];
    let mut queue = VecDeque::from([start]);
    seen[start] = true;
    while let Some(v) = queue.pop_front() {
        for &w in &adjacency[v] {
            if !member[w] {
                continue;
            }
            if w == start {
                let mut path = vec![v];
                let mut current = v;
                while current != start {
                    current = parent[current];
                    path.push(current);
                }
                path.reverse();
                path.push(start);
                return Some(path);
            }
            if !seen[w] {
                seen[w] = true;
                parent[w] = v;
                queue.push_back(w);
            }
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn graph<'a>(edges: &[(&'a str, &[&'a str])]) -> BTreeMap<&'a str, Vec<&'a str>> {
        edges.iter().map(|(n, r)| (*n, r.to_vec())).collect()
    }

    #[test]
    fn orders_dependencies_first_and_by_name() {
        let g = graph(&[
            ("eval", &["train"]),
            ("train", &["prep"]),
            ("prep", &[]),
            ("docs", &[]),
        ]);
        assert_eq!(topological_order(&g), ["docs", "prep", "train", "eval"]);
    }

    #[test]
    fn cycles_are_reported_once_from_their_first_name() {
        let g = graph(&[
            ("c", &["a"]),
            ("a", &["b"]),
            ("b", &["c"]),
            ("x", &["x"]),
            ("y", &["a"]),
        ]);
        assert_eq!(cycles(&g), vec![vec!["a", "b", "c", "a"], vec!["x", "x"]]);
        // Steps on or behind a cycle still appear, last.
        assert_eq!(topological_order(&g), ["a", "b", "c", "x", "y"]);
    }

    #[test]
    fn long_chains_do_not_overflow_the_stack() {
        let names: Vec<String> = (0..200_000).map(|i| format!("s{i:06}")).collect();
        let mut g: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
        for (i, name) in names.iter().enumerate() {
            let next = &names[(i + 1) % names.len()];
            g.insert(name, vec![next]);
        }
        let found = cycles(&g);
        assert_eq!(found.len(), 1);
        assert_eq!(found[0].len(), names.len() + 1);
        assert_eq!(topological_order(&g).len(), names.len());
    }
}
