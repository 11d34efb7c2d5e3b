//! Stage 1, second half: the active chain, so a rewound branch leaves the view.
//!
//! A transcript is a tree. Each record names its parent (`parentUuid`), and a host that
//! rewinds (the user goes back to an earlier prompt and sends another one) appends a
//! record whose parent is an earlier record: what followed that record on the old path
//! is an abandoned branch. It stays in the transcript, but it is no longer the
//! conversation, and the model must not see it. The active chain is the path from the
//! newest record back to the root, plus the records that belong with the records on it.
//!
//! The rules, over the records of the view in view order (the boundary the view starts
//! after is the root; a preserved segment's head hangs off its anchor):
//!
//! - A record with a `uuid` whose `parentUuid` names an earlier record of the view is
//!   **linked**: it becomes the newest record (the tip), and the path runs from it
//!   through its parents. Progress, system and error records are linked like messages:
//!   they sit in the chain and carry it on.
//! - A record without a parent (none, `null`, or one that is not in the view) is
//!   **loose**: it continues from the tip as it was when the record was appended, and
//!   does not move the tip. This is what keeps hosts that do not track parents (and the
//!   daemon's own records: state records, changed-file notes) in file order, as before.
//!   The price: a host that rewinds to its very first prompt writes a new root with a
//!   `null` parent, which reads as loose, so that rewind is not seen.
//! - The first record with a uuid, when there is no tip yet, is the root.
//! - A record appended again (a uuid already seen) follows the first copy.
//! - Sidechain records (a subagent's own conversation) are not part of it at all.
//!
//! A record is on the active chain when it is on the path, or when it belongs with the
//! record it hangs off and that record is on the chain: a loose record, a copy, a
//! bookkeeping record (progress, system: it carries no message, only the chain), and,
//! counting from the nearest message record above it (past bookkeeping records),
//! another line of the same response (`message.id`) or a record of tool results
//! answering a response line. The last two are what Claude Code writes for parallel tool
//! calls: each call is its own line (sometimes after a progress record), each result
//! hangs off its call's line, and the next response follows only one of the results, so
//! a bare walk from the tip would miss the others. (Two results for one call, one of
//! them on an abandoned branch, both stay; the normalizer keeps the first.)
//!
//! The chain is kept incrementally. A record whose parent is the tip, and a loose one,
//! cost a lookup and a push. Any other parent moves the tip: the path is cut back to
//! where the new record's ancestry meets it and the records whose membership may change
//! (the cut, the newly joined, and what hangs off them) are looked at again. When a
//! message-bearing record left or joined the chain, [`Pushed::Rewound`] tells the
//! caller to build the view again from the boundary; when only bookkeeping moved (a
//! progress record left behind by the tool result that follows it, a parallel result
//! joining), nothing else changes.

use std::collections::HashMap;

use super::item::{Item, Origin};
use crate::record::{Kind, Record};

const NONE: u32 = u32::MAX;

/// What pushing one record did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pushed {
    /// The record is on the chain; no earlier message record left or joined it.
    Kept,
    /// The record is a message record that is not on the chain (a copy of one that is
    /// not); nothing else changed.
    LeftOut,
    /// Earlier message records left or joined the chain: build the view again.
    Rewound,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Link {
    /// The boundary the view starts after, or the first record with a uuid.
    Root,
    /// Its parent is an earlier record of the view.
    Linked,
    /// No usable parent: hangs off the tip it was appended after.
    Loose,
    /// A record appended again: hangs off its first copy.
    Copy,
    /// A sidechain record: not part of this conversation.
    Ignored,
}

#[derive(Debug, Clone, PartialEq, Eq)]
struct Node {
    /// Index of the record in the records given.
    record: u32,
    link: Link,
    parent: u32,
    /// Position on the path, or `NONE`.
    path_pos: u32,
    /// The first record hanging off this one, and the next sibling: every child, so a
    /// change of membership reaches what depends on it.
    first_child: u32,
    next_sibling: u32,
    /// Carries a message (a user, assistant or attachment record).
    message: bool,
    member: bool,
}

impl Node {
    fn ignored(record: usize) -> Node {
        Node {
            record: u32::try_from(record).unwrap_or(NONE),
            link: Link::Ignored,
            parent: NONE,
            path_pos: NONE,
            first_child: NONE,
            next_sibling: NONE,
            message: false,
            member: true,
        }
    }
}

/// The active chain of a view (see the module docs).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Chain {
    nodes: Vec<Node>,
    /// Nodes before the first record of the view (the boundary).
    offset: usize,
    by_uuid: HashMap<Box<str>, u32>,
    path: Vec<u32>,
    tip: Option<u32>,
    /// Message records not on the chain.
    left_out: usize,
}

impl Chain {
    /// A chain rooted at `boundary` (the compact boundary the view starts after).
    pub fn new(records: &[Record], boundary: Option<usize>) -> Chain {
        let mut chain = Chain::default();
        if let Some(b) = boundary.filter(|&b| b < records.len()) {
            let id = chain.add_node(b, Link::Root, NONE, false);
            if let Some(uuid) = records[b].uuid() {
                chain.by_uuid.insert(Box::from(uuid), id);
            }
            chain.set_tip(id);
            // On the path, so on the chain: a record hanging loose off it (a summary
            // written without a parent) is too.
            chain.nodes[id as usize].member = true;
            chain.offset = 1;
        }
        chain
    }

    /// The chain of `order` (indices into `records`, in view order) after `boundary`.
    pub fn build(records: &[Record], boundary: Option<usize>, order: &[usize]) -> Chain {
        let mut chain = Chain::new(records, boundary);
        for &i in order {
            chain.push(records, i);
        }
        chain
    }

    /// True when the record at this position of the view order is part of the view: on
    /// the chain, or not a message record (state and bookkeeping records always are).
    pub fn keeps(&self, position: usize) -> bool {
        self.nodes.get(position + self.offset).is_none_or(|n| n.member || !n.message)
    }

    /// True when the record at this position of the view order is on the active chain
    /// or hangs off it, bookkeeping included: what a summary of the conversation covers
    /// (a progress or state record of an abandoned branch is no part of it either).
    pub fn on_chain(&self, position: usize) -> bool {
        self.nodes.get(position + self.offset).is_none_or(|n| n.member)
    }

    /// Message records not on the chain.
    pub fn left_out(&self) -> usize {
        self.left_out
    }

    /// Adds the next record of the view order.
    pub fn push(&mut self, records: &[Record], index: usize) -> Pushed {
        let Some(record) = records.get(index) else {
            // Keeps positions aligned with the view order; nothing to read.
            self.nodes.push(Node::ignored(index));
            return Pushed::Kept;
        };
        let head = record.head();
        let message = matches!(head.kind, Kind::User | Kind::Assistant | Kind::Attachment);
        if head.is_sidechain {
            self.nodes.push(Node::ignored(index));
            return Pushed::Kept;
        }
        let uuid = head.uuid.as_deref();
        if let Some(&first) = uuid.and_then(|u| self.by_uuid.get(u)) {
            let id = self.add_node(index, Link::Copy, first, message);
            return self.settle_new(id);
        }
        let parent = head.parent_uuid.as_deref().and_then(|p| self.by_uuid.get(p)).copied();
        match (uuid, parent, self.tip) {
            (Some(uuid), Some(parent), _) => {
                let rewound = self.route_to(parent, records);
                let id = self.add_node(index, Link::Linked, parent, message);
                self.by_uuid.insert(Box::from(uuid), id);
                self.set_tip(id);
                self.nodes[id as usize].member = true;
                if rewound { Pushed::Rewound } else { Pushed::Kept }
            }
            (Some(uuid), None, None) => {
                let id = self.add_node(index, Link::Root, NONE, message);
                self.by_uuid.insert(Box::from(uuid), id);
                self.set_tip(id);
                self.nodes[id as usize].member = true;
                Pushed::Kept
            }
            (uuid, _, tip) => {
                let id = self.add_node(index, Link::Loose, tip.unwrap_or(NONE), message);
                if let Some(uuid) = uuid {
                    self.by_uuid.insert(Box::from(uuid), id);
                }
                self.settle_new(id)
            }
        }
    }

    /// Makes the record with this uuid the tip, as if the next record hung off it (the
    /// boundary's `logicalParentUuid` names where an earlier conversation ended). False
    /// when the uuid is not in the view.
    pub fn end_at(&mut self, records: &[Record], uuid: &str) -> bool {
        let Some(&node) = self.by_uuid.get(uuid) else { return false };
        self.route_to(node, records);
        true
    }

    /// Makes the path run through the record with this uuid: nothing changes when it
    /// is on the path already (the tip is it or hangs below it), else it becomes the tip.
    /// False when the uuid is not in the view.
    pub fn run_through(&mut self, records: &[Record], uuid: &str) -> bool {
        let Some(&node) = self.by_uuid.get(uuid) else { return false };
        if self.nodes[node as usize].path_pos == NONE {
            self.route_to(node, records);
        }
        true
    }

    fn add_node(&mut self, record: usize, link: Link, parent: u32, message: bool) -> u32 {
        let id = self.nodes.len() as u32;
        let mut node = Node { link, parent, message, member: false, ..Node::ignored(record) };
        if let Some(p) = self.nodes.get_mut(parent as usize) {
            node.next_sibling = p.first_child;
            p.first_child = id;
        }
        self.nodes.push(node);
        id
    }

    fn set_tip(&mut self, id: u32) {
        self.nodes[id as usize].path_pos = self.path.len() as u32;
        self.path.push(id);
        self.tip = Some(id);
    }

    /// Membership of a node that hangs off another (loose or a copy) and was just added.
    fn settle_new(&mut self, id: u32) -> Pushed {
        let node = &self.nodes[id as usize];
        let member = node.parent == NONE || self.nodes[node.parent as usize].member;
        let message = node.message;
        self.nodes[id as usize].member = member;
        if message && !member {
            self.left_out += 1;
            Pushed::LeftOut
        } else {
            Pushed::Kept
        }
    }

    /// Makes `node` the tip: the path is cut back to where the node's ancestry meets it
    /// and extended to the node. True when a message record changed membership.
    fn route_to(&mut self, node: u32, records: &[Record]) -> bool {
        if self.tip == Some(node) {
            return false;
        }
        let (meet, up) = self.up_to_path(node);
        let changed = self.reroute(meet, up, records);
        self.tip = self.path.last().copied();
        changed
    }

    /// The nodes from `from` up to the path (not on it), and where they meet it.
    fn up_to_path(&self, from: u32) -> (Option<u32>, Vec<u32>) {
        let mut up = Vec::new();
        let mut at = from;
        while let Some(n) = self.nodes.get(at as usize) {
            if n.path_pos != NONE {
                return (Some(n.path_pos), up);
            }
            up.push(at);
            at = n.parent;
        }
        (None, up)
    }

    /// Cuts the path after `meet`, extends it with `up` (walked upwards, so reversed),
    /// and settles membership. True when a message record other than the new tip
    /// changed membership.
    fn reroute(&mut self, meet: Option<u32>, up: Vec<u32>, records: &[Record]) -> bool {
        let keep = meet.map_or(0, |k| k as usize + 1);
        let cut = self.path.split_off(keep);
        for &c in &cut {
            self.nodes[c as usize].path_pos = NONE;
        }
        for &u in up.iter().rev() {
            self.set_tip(u);
        }
        let mut work = cut;
        work.extend(up);
        let mut changed = false;
        while let Some(n) = work.pop() {
            let member = self.should_be_member(n, records);
            let node = &mut self.nodes[n as usize];
            if member == node.member {
                continue;
            }
            node.member = member;
            if node.message {
                changed = true;
                if member {
                    self.left_out -= 1;
                } else {
                    self.left_out += 1;
                }
            }
            let mut child = self.nodes[n as usize].first_child;
            while child != NONE {
                work.push(child);
                child = self.nodes[child as usize].next_sibling;
            }
        }
        changed
    }

    fn should_be_member(&self, n: u32, records: &[Record]) -> bool {
        let node = &self.nodes[n as usize];
        if node.path_pos != NONE || node.link == Link::Ignored {
            return true;
        }
        let Some(parent) = self.nodes.get(node.parent as usize) else {
            // Loose with no tip to hang off: nothing can leave it behind.
            return node.link == Link::Loose;
        };
        let belongs = match node.link {
            Link::Loose | Link::Copy => true,
            Link::Linked => {
                !node.message || {
                    let ancestor = self.message_ancestor(node.parent).and_then(|a| records.get(a.record as usize));
                    belongs_with(records.get(node.record as usize), ancestor)
                }
            }
            Link::Root | Link::Ignored => false,
        };
        belongs && parent.member
    }

    /// The nearest message record at or above `from`, past bookkeeping records.
    fn message_ancestor(&self, mut from: u32) -> Option<&Node> {
        while let Some(node) = self.nodes.get(from as usize) {
            if node.message {
                return Some(node);
            }
            from = node.parent;
        }
        None
    }
}

/// True when a message record belongs with the nearest message record above it:
/// another line of the same response, or tool results for a call of that response line.
fn belongs_with(child: Option<&Record>, ancestor: Option<&Record>) -> bool {
    let (Some(child), Some(parent)) = (child, ancestor) else { return false };
    let (c, p) = (child.head(), parent.head());
    if p.kind != Kind::Assistant {
        return false;
    }
    match c.kind {
        Kind::Assistant => c.message_id.is_some() && c.message_id == p.message_id,
        Kind::User => Item::from_record(child).is_some_and(|i| i.origin == Origin::ToolResults),
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashSet;

    use proptest::prelude::*;
    use serde_json::{Value, json};

    use super::*;

    /// The rules of the module docs, computed the slow way: the tip each record was
    /// appended after, then one walk from the final tip and a pass for what hangs off it.
    fn reference(records: &[Record]) -> Vec<bool> {
        #[derive(Clone, Copy, PartialEq)]
        enum L {
            Root,
            Linked,
            Loose,
            Copy,
            Ignored,
        }
        let mut first: HashMap<&str, usize> = HashMap::new();
        let mut parent: Vec<Option<usize>> = Vec::new();
        let mut link: Vec<L> = Vec::new();
        let mut tip: Option<usize> = None;
        for (i, r) in records.iter().enumerate() {
            let h = r.head();
            if h.is_sidechain {
                parent.push(None);
                link.push(L::Ignored);
                continue;
            }
            if let Some(&f) = h.uuid.as_deref().and_then(|u| first.get(u)) {
                parent.push(Some(f));
                link.push(L::Copy);
                continue;
            }
            let known = h.parent_uuid.as_deref().and_then(|p| first.get(p)).copied();
            let (p, l) = match (h.uuid.as_deref(), known, tip) {
                (Some(_), Some(p), _) => (Some(p), L::Linked),
                (Some(_), None, None) => (None, L::Root),
                (_, _, t) => (t, L::Loose),
            };
            if matches!(l, L::Linked | L::Root) {
                tip = Some(i);
            }
            if let Some(u) = h.uuid.as_deref() {
                first.insert(u, i);
            }
            parent.push(p);
            link.push(l);
        }
        let mut path: HashSet<usize> = HashSet::new();
        let mut at = tip;
        while let Some(n) = at {
            path.insert(n);
            at = parent[n];
        }
        let is_message = |r: &Record| matches!(r.head().kind, Kind::User | Kind::Assistant | Kind::Attachment);
        let message_ancestor = |mut at: Option<usize>| {
            while let Some(a) = at {
                if is_message(&records[a]) {
                    return Some(&records[a]);
                }
                at = parent[a];
            }
            None
        };
        let mut member = vec![false; records.len()];
        for i in 0..records.len() {
            member[i] = path.contains(&i)
                || link[i] == L::Ignored
                || match (link[i], parent[i]) {
                    (L::Loose, None) => true,
                    (L::Loose | L::Copy, Some(p)) => member[p],
                    (L::Linked, Some(p)) => {
                        member[p]
                            && (!is_message(&records[i]) || belongs_with(Some(&records[i]), message_ancestor(Some(p))))
                    }
                    _ => false,
                };
        }
        member
    }

    fn kept(records: &[Record]) -> Vec<bool> {
        let order: Vec<usize> = (0..records.len()).collect();
        let chain = Chain::build(records, None, &order);
        (0..records.len()).map(|i| chain.nodes[i].member).collect()
    }

    #[derive(Debug, Clone)]
    enum Step {
        /// A prompt hanging off the k-th record back (0: the last one).
        Prompt(usize),
        /// A response of n lines, each a call, each answered by a result hanging off its
        /// line; the next record follows the result of `follow`.
        Parallel(usize, usize),
        Progress,
        Loose,
        Side,
        Copy(usize),
        NoUuid,
    }

    fn step() -> impl Strategy<Value = Step> {
        prop_oneof![
            4 => prop_oneof![6 => Just(0usize), 1 => 0usize..12].prop_map(Step::Prompt),
            3 => (1usize..4, 0usize..4).prop_map(|(n, f)| Step::Parallel(n, f)),
            2 => Just(Step::Progress),
            1 => Just(Step::Loose),
            1 => Just(Step::Side),
            1 => (0usize..20).prop_map(Step::Copy),
            1 => Just(Step::NoUuid),
        ]
    }

    fn records_of(steps: &[Step]) -> Vec<Record> {
        let mut lines: Vec<Value> = Vec::new();
        let mut uuids: Vec<String> = Vec::new();
        let mut follow: Option<String> = None;
        let mut n = 0;
        let mut next = |prefix: &str| {
            n += 1;
            format!("{prefix}{n}")
        };
        for s in steps {
            let last = follow.take().or_else(|| uuids.last().cloned());
            match s {
                Step::Prompt(k) => {
                    let parent =
                        if *k == 0 { last } else { uuids.len().checked_sub(k + 1).map(|i| uuids[i].clone()).or(last) };
                    let u = next("u");
                    lines.push(json!({"type": "user", "uuid": u, "parentUuid": parent, "message": {"role": "user", "content": "p"}}));
                    uuids.push(u);
                }
                Step::Parallel(count, f) => {
                    let m = next("m");
                    let mut parent = last;
                    let mut calls = Vec::new();
                    for k in 0..*count {
                        if k % 2 == 1 {
                            let p = next("p");
                            lines.push(json!({"type": "progress", "uuid": p, "parentUuid": parent}));
                            parent = Some(p);
                        }
                        let a = next("a");
                        let t = next("t");
                        lines.push(json!({"type": "assistant", "uuid": a, "parentUuid": parent, "message": {"id": m, "role": "assistant", "content": [{"type": "tool_use", "id": t, "name": "Read", "input": {}}]}}));
                        uuids.push(a.clone());
                        parent = Some(a.clone());
                        calls.push((a, t));
                    }
                    let mut results = Vec::new();
                    for (a, t) in calls {
                        let r = next("r");
                        lines.push(json!({"type": "user", "uuid": r, "parentUuid": a, "message": {"role": "user", "content": [{"type": "tool_result", "tool_use_id": t, "content": "x"}]}}));
                        uuids.push(r.clone());
                        results.push(r);
                    }
                    follow = Some(results[f % results.len()].clone());
                }
                Step::Progress => {
                    let p = next("p");
                    lines.push(json!({"type": "progress", "uuid": p, "parentUuid": last}));
                    uuids.push(p);
                }
                Step::Loose => {
                    let l = next("l");
                    lines.push(json!({"type": "attachment", "uuid": l, "attachment": {"type": "note"}, "rendered": [{"content": "n"}]}));
                    follow = last;
                }
                Step::Side => {
                    let x = next("x");
                    lines.push(json!({"type": "user", "isSidechain": true, "uuid": x, "parentUuid": null, "message": {"role": "user", "content": "s"}}));
                    follow = last;
                }
                Step::Copy(k) => {
                    if !lines.is_empty() {
                        let again = lines[lines.len() - 1 - k % lines.len()].clone();
                        lines.push(again);
                    }
                    follow = last;
                }
                Step::NoUuid => {
                    lines.push(json!({"type": "user", "message": {"role": "user", "content": "no uuid"}}));
                    follow = last;
                }
            }
        }
        lines.iter().map(|l| Record::parse(&l.to_string()).unwrap()).collect()
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

        /// Pushing records one at a time gives the chain the rules define, after every
        /// record, and says `Rewound` exactly when an earlier message record changed.
        #[test]
        fn incremental_chain_follows_the_rules(steps in prop::collection::vec(step(), 1..40)) {
            let records = records_of(&steps);
            let mut chain = Chain::new(&records, None);
            let mut before: Vec<bool> = Vec::new();
            for i in 0..records.len() {
                let pushed = chain.push(&records, i);
                let now: Vec<bool> = (0..=i).map(|k| chain.nodes[k].member).collect();
                prop_assert_eq!(&now, &reference(&records[..=i]), "after {} records", i + 1);
                let message = |k: usize| chain.nodes[k].message;
                let changed = (0..i).any(|k| message(k) && before[k] != now[k]);
                let expected = if changed {
                    Pushed::Rewound
                } else if message(i) && !now[i] {
                    Pushed::LeftOut
                } else {
                    Pushed::Kept
                };
                prop_assert_eq!(pushed, expected, "record {}", i);
                prop_assert_eq!(chain.left_out(), (0..=i).filter(|&k| message(k) && !now[k]).count());
                before = now;
            }
        }
    }

    fn line(v: Value) -> Record {
        Record::parse(&v.to_string()).unwrap()
    }

    fn prompt(uuid: &str, parent: Option<&str>, text: &str) -> Record {
        line(json!({"type": "user", "uuid": uuid, "parentUuid": parent, "message": {"role": "user", "content": text}}))
    }

    fn reply(uuid: &str, parent: &str, text: &str) -> Record {
        line(json!({"type": "assistant", "uuid": uuid, "parentUuid": parent,
            "message": {"id": format!("m-{uuid}"), "role": "assistant", "content": [{"type": "text", "text": text}]}}))
    }

    #[test]
    fn a_rewind_leaves_the_old_branch_and_a_branch_switch_brings_it_back() {
        let records = vec![
            prompt("u1", None, "a"),
            reply("a1", "u1", "b"),
            prompt("u2", Some("a1"), "c"),
            prompt("u2b", Some("a1"), "c again"),
            reply("a3", "u2", "d"),
        ];
        let mut chain = Chain::new(&records, None);
        let pushed: Vec<Pushed> = (0..records.len()).map(|i| chain.push(&records, i)).collect();
        assert_eq!(pushed, [Pushed::Kept, Pushed::Kept, Pushed::Kept, Pushed::Rewound, Pushed::Rewound]);
        assert_eq!(kept(&records), [true, true, true, false, true]);
        assert!(chain.end_at(&records, "u2b"));
        assert_eq!((0..5).map(|i| chain.keeps(i)).collect::<Vec<_>>(), [true, true, false, true, false]);
        assert!(!chain.end_at(&records, "nope"));
    }

    #[test]
    fn running_through_the_newest_message_follows_the_program_not_a_later_bookkeeping_record() {
        // A branch (u2b, a2b) after a rewind to a1, then a system record the host hung
        // off the old branch's reply a2: the view's tip moves there, but the program
        // resumes from its newest message, a2b.
        let records = vec![
            prompt("u1", None, "a"),
            reply("a1", "u1", "b"),
            prompt("u2", Some("a1"), "c"),
            reply("a2", "u2", "d"),
            prompt("u2b", Some("a1"), "c again"),
            reply("a2b", "u2b", "e"),
            line(json!({"type": "system", "subtype": "turn_duration", "uuid": "y", "parentUuid": "a2"})),
        ];
        let (mut slice, _) = super::super::slice::slice_after_boundary(&records);
        assert_eq!(slice.on_chain().collect::<Vec<_>>(), [0, 1, 2, 3, 6], "the view follows the newest link");
        slice.end_at_newest_message(&records);
        assert_eq!(slice.on_chain().collect::<Vec<_>>(), [0, 1, 4, 5]);
        // Already on the path: nothing moves (what hangs below the tip stays).
        let mut chain = Chain::build(&records[..6], None, &[0, 1, 2, 3, 4, 5]);
        assert!(chain.run_through(&records, "u2b") && chain.tip == Some(5));
        assert!(!chain.run_through(&records, "nope"));
    }

    #[test]
    fn a_record_hanging_loose_off_the_boundary_is_on_the_chain() {
        // A summary written without a parent, right after the boundary.
        let records = vec![
            line(json!({"type": "system", "subtype": "compact_boundary", "uuid": "b", "parentUuid": null})),
            line(
                json!({"type": "user", "uuid": "s", "isCompactSummary": true, "message": {"role": "user", "content": "summary"}}),
            ),
            prompt("u1", Some("gone"), "a"),
            reply("a1", "u1", "b"),
        ];
        let chain = Chain::build(&records, Some(0), &[1, 2, 3]);
        assert_eq!((0..3).map(|p| chain.keeps(p)).collect::<Vec<_>>(), [true, true, true]);
        assert_eq!(chain.left_out(), 0);
    }
}
