//! A small, bounded reader for the plain-data subset of Python pickles (protocols 2 to 5)
//! that `torch.cuda.memory._snapshot()` writes: dicts, lists, tuples, ints, floats,
//! strings, bytes, bools and None, with memoized sharing. It builds no Python objects
//! (no GLOBAL, REDUCE, BUILD): such a pickle is refused with the opcode and its offset.
//! Every limit is checked, so hostile input ends in an error, never a panic or a hang.
//! The input is a slice or a stream (`from_reader`, so a gunzipped file is never held
//! whole), and a caller may take over dicts as they are finished (`Reducer`), so a
//! snapshot's millions of trace entries are turned into compact events as they are read
//! instead of being built as a tree first. Depends on nothing else in the crate.

use std::collections::{HashMap, HashSet};
use std::hash::{BuildHasherDefault, Hasher};
use std::io::Read;
use std::rc::Rc;

mod error;
mod memo;
mod opcodes;
mod source;
mod value;

pub use error::{PickleError, PickleErrorKind};
use memo::Memo;
pub use opcodes::opcode_name;
use source::{ReadSource, SliceSource, Source};
pub use value::{Dict, Value};

/// Bounds on what a pickle may make us build. Each count limit is the larger of its
/// fixed floor and half the bytes read so far (`scale_with_input`): an item, a memo
/// entry or a stack slot costs the pickle at least one opcode byte, so what a pickle can
/// make us hold stays a bounded multiple of its own size, and a real snapshot of any
/// size fits while a small hostile one cannot blow up. Input size is bounded by the caller.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    /// Containers nested inside each other, counting shared ones along every path.
    pub max_depth: usize,
    /// Memo entries, and the highest memo index a BINPUT may name.
    pub max_memo: usize,
    /// Values on the unpickler's stack at once.
    pub max_stack: usize,
    /// Items in all containers together (a dict entry counts two).
    pub max_items: usize,
    /// Raise the three count limits above to half the bytes read so far.
    pub scale_with_input: bool,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_depth: 128,
            max_memo: 1 << 22,
            max_stack: 1 << 20,
            max_items: 1 << 24,
            scale_with_input: true,
        }
    }
}

/// A list or dict just finished, as a `Reducer` sees it.
pub enum Finished<'a> {
    List(&'a [Value]),
    Dict(&'a Dict),
}

/// Takes over a list or dict the moment it is finished: returns the value to use in its
/// place (say, an index into the caller's own table, as `Value::Reduced`), or `None` to
/// keep it as it is.
pub type Reducer<'r> = &'r mut dyn FnMut(Finished<'_>) -> Option<Value>;

/// Reads one pickle from `input` with the default limits.
pub fn from_slice(input: &[u8]) -> Result<Value, PickleError> {
    from_slice_with(input, Limits::default())
}

/// Reads one pickle from `input`; bytes after STOP are ignored, as Python does.
pub fn from_slice_with(input: &[u8], limits: Limits) -> Result<Value, PickleError> {
    Machine::new(SliceSource::new(input), limits, None).run()
}

/// Reads one pickle from a stream of at most `max_bytes`, handing finished dicts to
/// `reducer` when one is given. The reader's own failures are returned as `Err(io)`.
pub fn from_reader(
    reader: impl Read,
    max_bytes: u64,
    limits: Limits,
    reducer: Option<Reducer<'_>>,
) -> Result<Value, ReadError> {
    let mut machine = Machine::new(ReadSource::new(reader, max_bytes), limits, reducer);
    let result = machine.run();
    if result.is_ok() {
        machine.source.finish();
    }
    match machine.source.take_failure() {
        Some(failure) => Err(failure),
        None => result.map_err(ReadError::Pickle),
    }
}

/// Why `from_reader` failed: the stream, its size, or the pickle itself.
#[derive(Debug)]
pub enum ReadError {
    Io(std::io::Error),
    /// The stream holds more than `max_bytes`.
    TooLarge,
    Pickle(PickleError),
}

/// A stack or memo entry while reading: a finished value with its nesting depth, or a
/// list or dict still open to APPEND/SETITEM (it may be memoized before it is filled).
#[derive(Clone, Debug)]
enum Slot {
    Val(Value, u32),
    Open(u32),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum NodeKind {
    List,
    Dict,
}

/// An open container. It is frozen into a `Value` the first time it is put into another
/// container (or returned): the pickler writes a container whole before using it, so
/// nothing can be added to it afterwards, and freezing then needs no second pass.
struct Node {
    kind: NodeKind,
    /// Items; a dict's are flattened key, value, key, value.
    items: Vec<Value>,
    /// Deepest item nesting so far.
    depth: u32,
    /// The memo entry that names it (MEMOIZE right after EMPTY_DICT, the usual case).
    memo_at: Option<u64>,
    /// Named by more than its own stack slot and `memo_at` (GET or DUP while open, or a
    /// second PUT): its frozen value must stay findable by its id.
    shared: bool,
}

/// Hashes keys our own code makes (container ids, addresses) with one multiply instead of
/// SipHash. Never for strings or numbers read from the file. A file still picks which ids
/// stay held, so `finish` brings the product's high bits down: the table places keys by
/// the low bits, and those of `id * odd` depend only on the id's own low bits (ids 8192
/// apart would all land on one spot).
#[derive(Default)]
pub(crate) struct IdHasher(u64);

impl Hasher for IdHasher {
    fn finish(&self) -> u64 {
        self.0.rotate_left(26)
    }

    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0.rotate_left(8) ^ u64::from(b)).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        }
    }

    fn write_u32(&mut self, n: u32) {
        self.write_u64(u64::from(n));
    }

    fn write_u64(&mut self, n: u64) {
        self.0 = n.wrapping_mul(0x9E37_79B9_7F4A_7C15);
    }

    fn write_usize(&mut self, n: usize) {
        self.write_u64(n as u64);
    }
}

type IdMap<V> = HashMap<u32, V, BuildHasherDefault<IdHasher>>;

/// The containers of one pickle, by id. A snapshot has millions; only the few open at a
/// time are held here. When one is frozen its value goes to the memo entry that names it,
/// and only a shared one (see `Node::shared`) keeps its value here by id.
#[derive(Default)]
struct Nodes {
    open: IdMap<Node>,
    frozen_shared: IdMap<(Value, u32)>,
    /// Containers made so far: the next id.
    made: u32,
}

impl Nodes {
    /// Notes one more name for container `id` when `slot` is it, still open.
    fn note_shared(&mut self, slot: &Slot) {
        if let Slot::Open(id) = slot {
            if let Some(node) = self.open.get_mut(id) {
                node.shared = true;
            }
        }
    }
}

struct Machine<'r, S> {
    source: S,
    reducer: Option<Reducer<'r>>,
    op_at: usize,
    limits: Limits,
    stack: Vec<Slot>,
    /// Stack heights at each MARK.
    marks: Vec<usize>,
    memo: Memo<Slot>,
    nodes: Nodes,
    /// Short strings read so far, shared (see `push_str`).
    short_strs: HashSet<Rc<str>>,
    items: usize,
    /// The stack and item limits as last computed (they grow with the input).
    stack_cap: usize,
    items_cap: usize,
}

type Step<T> = Result<T, PickleError>;

/// Strings up to this many bytes are shared (`push_str`), up to this many of them.
const SHARED_STR_MAX_LEN: usize = 48;
const SHARED_STR_MAX_COUNT: usize = 1 << 16;

fn fail<T>(offset: usize, kind: PickleErrorKind) -> Step<T> {
    Err(PickleError { offset, kind })
}

/// The finished value of `slot`, freezing an open container on first use; a list or
/// dict the reducer takes over is replaced by what it returns.
#[inline]
fn close(
    nodes: &mut Nodes,
    memo: &mut Memo<Slot>,
    reducer: &mut Option<Reducer<'_>>,
    slot: Slot,
    max_depth: usize,
    at: usize,
) -> Step<(Value, u32)> {
    match slot {
        Slot::Val(v, d) => Ok((v, d)),
        Slot::Open(id) => close_node(nodes, memo, reducer, id, max_depth, at),
    }
}

fn close_node(
    nodes: &mut Nodes,
    memo: &mut Memo<Slot>,
    reducer: &mut Option<Reducer<'_>>,
    id: u32,
    max_depth: usize,
    at: usize,
) -> Step<(Value, u32)> {
    if let Some((v, d)) = nodes.frozen_shared.get(&id) {
        return Ok((v.clone(), *d));
    }
    // Not open and not shared: nothing else could still name it (see `Node::shared`).
    let Some(node) = nodes.open.remove(&id) else {
        return fail(at, PickleErrorKind::Malformed("unknown container"));
    };
    let Node {
        kind,
        items,
        depth,
        memo_at,
        shared,
    } = node;
    let depth = depth + 1;
    if depth as usize > max_depth {
        return fail(at, PickleErrorKind::LimitExceeded("nesting depth"));
    }
    let value = match kind {
        NodeKind::List => match reducer.as_mut().and_then(|r| r(Finished::List(&items))) {
            Some(reduced) => reduced,
            None => Value::List(Rc::new(items)),
        },
        NodeKind::Dict => {
            let dict = Dict::from_flat(items);
            match reducer.as_mut().and_then(|r| r(Finished::Dict(&dict))) {
                Some(reduced) => reduced,
                None => Value::Dict(Rc::new(dict)),
            }
        }
    };
    if let Some(entry) = memo_at.and_then(|i| memo.get_mut(i)) {
        if matches!(entry, Slot::Open(named) if *named == id) {
            *entry = Slot::Val(value.clone(), depth);
        }
    }
    if shared {
        nodes.frozen_shared.insert(id, (value.clone(), depth));
    }
    Ok((value, depth))
}

impl<'r, S: Source> Machine<'r, S> {
    fn new(source: S, limits: Limits, reducer: Option<Reducer<'r>>) -> Self {
        Machine {
            source,
            reducer,
            op_at: 0,
            limits,
            stack: Vec::new(),
            marks: Vec::new(),
            memo: Memo::new(),
            nodes: Nodes::default(),
            short_strs: HashSet::new(),
            items: 0,
            stack_cap: limits.max_stack,
            items_cap: limits.max_items,
        }
    }

    fn err<T>(&self, kind: PickleErrorKind) -> Step<T> {
        fail(self.op_at, kind)
    }

    /// `floor`, raised to half the bytes read so far when the limits scale with input.
    fn limit(&self, floor: usize) -> usize {
        if self.limits.scale_with_input {
            floor.max(self.source.position() / 2)
        } else {
            floor
        }
    }

    fn take(&mut self, n: usize) -> Step<&[u8]> {
        let at = self.op_at;
        match self.source.take(n) {
            Some(bytes) => Ok(bytes),
            None => fail(at, PickleErrorKind::Truncated),
        }
    }

    fn byte(&mut self) -> Step<u8> {
        Ok(self.take(1)?[0])
    }

    fn u32_le(&mut self) -> Step<u32> {
        let b = self.take(4)?;
        Ok(u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    }

    fn u64_le(&mut self) -> Step<u64> {
        let b = self.take(8)?;
        let mut a = [0u8; 8];
        a.copy_from_slice(b);
        Ok(u64::from_le_bytes(a))
    }

    fn len_u64(&mut self) -> Step<usize> {
        let n = self.u64_le()?;
        match usize::try_from(n) {
            Ok(n) => Ok(n),
            Err(_) => self.err(PickleErrorKind::Truncated),
        }
    }

    #[inline]
    fn push(&mut self, slot: Slot) -> Step<()> {
        // The limit grows with the input: look it up again only when the cached one is hit.
        if self.stack.len() >= self.stack_cap {
            self.stack_cap = self.limit(self.limits.max_stack);
            if self.stack.len() >= self.stack_cap {
                return self.err(PickleErrorKind::LimitExceeded("stack size"));
            }
        }
        self.stack.push(slot);
        Ok(())
    }

    fn push_val(&mut self, value: Value) -> Step<()> {
        self.push(Slot::Val(value, 0))
    }

    fn floor(&self) -> usize {
        self.marks.last().copied().unwrap_or(0)
    }

    fn pop(&mut self) -> Step<Slot> {
        match self.stack.pop() {
            Some(s) if self.stack.len() >= self.floor() => Ok(s),
            _ => self.err(PickleErrorKind::Malformed("pop from an empty stack")),
        }
    }

    fn top(&self) -> Step<Slot> {
        match self.stack.last() {
            Some(s) if self.stack.len() > self.floor() => Ok(s.clone()),
            _ => self.err(PickleErrorKind::Malformed("empty stack")),
        }
    }

    /// Stack height at the last MARK, which is removed.
    fn take_mark(&mut self) -> Step<usize> {
        match self.marks.pop() {
            Some(at) => Ok(at),
            None => self.err(PickleErrorKind::Malformed("no MARK to pop to")),
        }
    }

    /// Stack height `n` items below the top, if those items are above the last MARK.
    fn height_less(&self, n: usize) -> Step<usize> {
        match self.stack.len().checked_sub(n) {
            Some(h) if h >= self.floor() => Ok(h),
            _ => self.err(PickleErrorKind::Malformed(
                "fewer items on the stack than needed",
            )),
        }
    }

    fn count_items(&mut self, n: usize) -> Step<()> {
        self.items = self.items.saturating_add(n);
        if self.items > self.items_cap {
            self.items_cap = self.limit(self.limits.max_items);
            if self.items > self.items_cap {
                return self.err(PickleErrorKind::LimitExceeded("number of items"));
            }
        }
        Ok(())
    }

    /// Appends the stack items above height `from`, finished, to `values`; returns
    /// `values` and the deepest nesting among the items.
    fn drain_into(&mut self, from: usize, mut values: Vec<Value>) -> Step<(Vec<Value>, u32)> {
        self.count_items(self.stack.len() - from)?;
        let (max_depth, at) = (self.limits.max_depth, self.op_at);
        let mut depth = 0;
        values.reserve(self.stack.len() - from);
        for slot in self.stack.drain(from..) {
            let (v, d) = close(
                &mut self.nodes,
                &mut self.memo,
                &mut self.reducer,
                slot,
                max_depth,
                at,
            )?;
            depth = depth.max(d);
            values.push(v);
        }
        Ok((values, depth))
    }

    fn new_node(&mut self, kind: NodeKind, items: Vec<Value>, depth: u32) -> Step<()> {
        let id = self.nodes.made;
        if id == u32::MAX || id as usize >= self.limit(self.limits.max_items) {
            return self.err(PickleErrorKind::LimitExceeded("number of containers"));
        }
        self.nodes.made += 1;
        let node = Node {
            kind,
            items,
            depth,
            memo_at: None,
            shared: false,
        };
        self.nodes.open.insert(id, node);
        self.push(Slot::Open(id))
    }

    fn new_tuple(&mut self, from: usize) -> Step<()> {
        let (items, depth) = self.drain_into(from, Vec::new())?;
        if depth as usize >= self.limits.max_depth {
            return self.err(PickleErrorKind::LimitExceeded("nesting depth"));
        }
        self.push(Slot::Val(Value::Tuple(Rc::new(items)), depth + 1))
    }

    /// Moves the stack items above height `from` into the open container just below
    /// them (APPEND/APPENDS/SETITEM/SETITEMS), if it has the expected kind.
    fn extend_from(&mut self, from: usize, want: NodeKind) -> Step<()> {
        if want == NodeKind::Dict && (self.stack.len() - from) % 2 != 0 {
            return self.err(PickleErrorKind::Malformed(
                "SETITEMS with an odd item count",
            ));
        }
        let target = match from.checked_sub(1).filter(|&i| i >= self.floor()) {
            Some(i) => self.stack[i].clone(),
            None => return self.err(PickleErrorKind::Malformed("nothing to add items to")),
        };
        let id = match target {
            Slot::Open(id) => match self.nodes.open.get(&id) {
                Some(node) if node.kind == want => id,
                // Frozen already: it was put inside something it contains.
                None => return self.err(PickleErrorKind::Recursive),
                Some(_) => {
                    return self.err(PickleErrorKind::Malformed(match want {
                        NodeKind::Dict => "SETITEM on something that is not a dict",
                        NodeKind::List => "APPEND on something that is not a list",
                    }))
                }
            },
            // A finished list or dict (its memo entry holds the value once it is frozen):
            // as above, the pickler only adds to one it is still writing.
            Slot::Val(Value::List(_) | Value::Dict(_) | Value::Reduced(_), _) => {
                return self.err(PickleErrorKind::Recursive)
            }
            _ => {
                return self.err(PickleErrorKind::Malformed(match want {
                    NodeKind::Dict => "SETITEM on something that is not a dict",
                    NodeKind::List => "APPEND on something that is not a list",
                }))
            }
        };
        // Fill the node's own buffer: no second copy of the items.
        let items = match self.nodes.open.get_mut(&id) {
            Some(node) => std::mem::take(&mut node.items),
            None => return self.err(PickleErrorKind::Recursive),
        };
        let (filled, item_depth) = self.drain_into(from, items)?;
        match self.nodes.open.get_mut(&id) {
            Some(node) => {
                node.depth = node.depth.max(item_depth);
                node.items = filled;
                Ok(())
            }
            // The container was put inside one of its own items: a cycle.
            None => self.err(PickleErrorKind::Recursive),
        }
    }

    fn memo_put(&mut self, index: u64) -> Step<()> {
        let slot = self.top()?;
        let max_memo = self.limit(self.limits.max_memo);
        if index >= max_memo as u64 {
            return self.err(PickleErrorKind::LimitExceeded("memo size"));
        }
        if self.memo.is_sparse(index) && self.memo.sparse_len() >= max_memo {
            return self.err(PickleErrorKind::LimitExceeded("memo size"));
        }
        if let Slot::Open(id) = slot {
            if let Some(node) = self.nodes.open.get_mut(&id) {
                match node.memo_at {
                    None => node.memo_at = Some(index),
                    Some(_) => node.shared = true,
                }
            }
        }
        self.memo.put(index, slot);
        Ok(())
    }

    fn memo_get(&mut self, index: u64) -> Step<()> {
        match self.memo.get(index).cloned() {
            Some(slot) => {
                self.nodes.note_shared(&slot);
                self.push(slot)
            }
            None => self.err(PickleErrorKind::MemoMissing(index)),
        }
    }

    fn push_str(&mut self, n: usize) -> Step<()> {
        // A snapshot writes some short strings afresh in every trace entry ('N/A' as each
        // one's compile_context: 2 million in a 2-million-event trace), and the memo keeps
        // each: one shared copy of each short string saves an allocation per entry.
        // (`source.take` rather than `take`: the borrow of the bytes is then only of `source`.)
        let Some(bytes) = self.source.take(n) else {
            return fail(self.op_at, PickleErrorKind::Truncated);
        };
        let text = String::from_utf8_lossy(bytes);
        let s: Rc<str> = if n > SHARED_STR_MAX_LEN {
            text.into()
        } else if let Some(shared) = self.short_strs.get(&*text) {
            shared.clone()
        } else {
            let fresh: Rc<str> = text.into();
            if self.short_strs.len() < SHARED_STR_MAX_COUNT {
                self.short_strs.insert(fresh.clone());
            }
            fresh
        };
        self.push_val(Value::Str(s))
    }

    fn push_bytes(&mut self, n: usize) -> Step<()> {
        let b: Rc<[u8]> = self.take(n)?.into();
        self.push_val(Value::Bytes(b))
    }

    fn push_long(&mut self, n: usize) -> Step<()> {
        let value = decode_long(self.take(n)?);
        self.push_val(value)
    }

    /// Runs opcodes to STOP and returns the value on top of the stack.
    fn run(&mut self) -> Step<Value> {
        loop {
            self.op_at = self.source.position();
            let op = self.byte()?;
            if op == b'.' {
                let top = self.pop()?;
                let (limit, at) = (self.limits.max_depth, self.op_at);
                return close(
                    &mut self.nodes,
                    &mut self.memo,
                    &mut self.reducer,
                    top,
                    limit,
                    at,
                )
                .map(|(v, _)| v);
            }
            // Memo opcodes are the most frequent in snapshots (900k of 1.6M in resnet50).
            if !self.control(op)? && !self.scalar(op)? && !self.container(op)? {
                return self.err(PickleErrorKind::Unsupported { opcode: op });
            }
        }
    }

    /// Opcodes that push one number, string, bytes, bool or None. False: not one.
    fn scalar(&mut self, op: u8) -> Step<bool> {
        match op {
            b'N' => self.push_val(Value::None)?,
            0x88 => self.push_val(Value::Bool(true))?,
            0x89 => self.push_val(Value::Bool(false))?,
            b'J' => {
                let v = self.u32_le()? as i32;
                self.push_val(Value::Int(i64::from(v)))?;
            }
            b'K' => {
                let v = self.byte()?;
                self.push_val(Value::Int(i64::from(v)))?;
            }
            b'M' => {
                let b = self.take(2)?;
                let v = u16::from_le_bytes([b[0], b[1]]);
                self.push_val(Value::Int(i64::from(v)))?;
            }
            0x8a => {
                let n = self.byte()? as usize;
                self.push_long(n)?;
            }
            0x8b => {
                let n = self.u32_le()? as i32;
                if n < 0 {
                    return self.err(PickleErrorKind::Malformed("LONG4 with a negative length"));
                }
                self.push_long(n as usize)?;
            }
            b'G' => {
                let b = self.take(8)?;
                let mut a = [0u8; 8];
                a.copy_from_slice(b);
                self.push_val(Value::Float(f64::from_be_bytes(a)))?;
            }
            0x8c => {
                let n = self.byte()? as usize;
                self.push_str(n)?;
            }
            b'X' => {
                let n = self.u32_le()? as usize;
                self.push_str(n)?;
            }
            0x8d => {
                let n = self.len_u64()?;
                self.push_str(n)?;
            }
            b'C' => {
                let n = self.byte()? as usize;
                self.push_bytes(n)?;
            }
            b'B' => {
                let n = self.u32_le()? as usize;
                self.push_bytes(n)?;
            }
            0x8e | 0x96 => {
                let n = self.len_u64()?;
                self.push_bytes(n)?;
            }
            _ => return Ok(false),
        }
        Ok(true)
    }

    /// Opcodes that build or fill lists, dicts and tuples. False: not one.
    fn container(&mut self, op: u8) -> Step<bool> {
        match op {
            b'}' => self.new_node(NodeKind::Dict, Vec::new(), 0)?,
            b']' => self.new_node(NodeKind::List, Vec::new(), 0)?,
            b')' => self.push(Slot::Val(Value::Tuple(Rc::new(Vec::new())), 1))?,
            0x85..=0x87 => {
                let from = self.height_less(usize::from(op - 0x84))?;
                self.new_tuple(from)?;
            }
            b't' => {
                let from = self.take_mark()?;
                self.new_tuple(from)?;
            }
            b'l' | b'd' => {
                let from = self.take_mark()?;
                if op == b'd' && (self.stack.len() - from) % 2 != 0 {
                    return self.err(PickleErrorKind::Malformed("DICT with an odd item count"));
                }
                let (items, depth) = self.drain_into(from, Vec::new())?;
                let kind = if op == b'l' {
                    NodeKind::List
                } else {
                    NodeKind::Dict
                };
                self.new_node(kind, items, depth)?;
            }
            b'a' | b's' => {
                let (count, kind) = if op == b'a' {
                    (1, NodeKind::List)
                } else {
                    (2, NodeKind::Dict)
                };
                let from = self.height_less(count)?;
                self.extend_from(from, kind)?;
            }
            b'e' | b'u' => {
                let from = self.take_mark()?;
                let kind = if op == b'e' {
                    NodeKind::List
                } else {
                    NodeKind::Dict
                };
                self.extend_from(from, kind)?;
            }
            _ => return Ok(false),
        }
        Ok(true)
    }

    /// Protocol, framing, stack and memo opcodes. False: not one.
    fn control(&mut self, op: u8) -> Step<bool> {
        match op {
            0x80 => {
                let proto = self.byte()?;
                if !(2..=5).contains(&proto) {
                    return self.err(PickleErrorKind::Protocol(proto));
                }
            }
            // FRAME: only a hint for buffered readers; we hold the whole input.
            0x95 => {
                self.u64_le()?;
            }
            b'(' => {
                if self.marks.len() >= self.limit(self.limits.max_stack) {
                    return self.err(PickleErrorKind::LimitExceeded("MARK count"));
                }
                self.marks.push(self.stack.len());
            }
            b'0' => {
                self.pop()?;
            }
            b'1' => {
                let from = self.take_mark()?;
                self.stack.truncate(from);
            }
            b'2' => {
                let top = self.top()?;
                self.nodes.note_shared(&top);
                self.push(top)?;
            }
            b'h' => {
                let i = self.byte()?;
                self.memo_get(u64::from(i))?;
            }
            b'j' => {
                let i = self.u32_le()?;
                self.memo_get(u64::from(i))?;
            }
            b'q' => {
                let i = self.byte()?;
                self.memo_put(u64::from(i))?;
            }
            b'r' => {
                let i = self.u32_le()?;
                self.memo_put(u64::from(i))?;
            }
            0x94 => self.memo_put(self.memo.len() as u64)?,
            _ => return Ok(false),
        }
        Ok(true)
    }
}

/// Decodes a LONG1/LONG4 payload: little-endian two's complement.
fn decode_long(bytes: &[u8]) -> Value {
    if bytes.is_empty() {
        return Value::Int(0);
    }
    let negative = bytes[bytes.len() - 1] & 0x80 != 0;
    let fill = if negative { 0xff } else { 0x00 };
    // Bytes past the eighth must be pure sign extension for the value to fit an i64.
    let fits = bytes.len() <= 8
        || (bytes[8..].iter().all(|&b| b == fill) && ((bytes[7] & 0x80 != 0) == negative));
    if !fits {
        return Value::BigInt(bytes.into());
    }
    let mut a = [fill; 8];
    let n = bytes.len().min(8);
    a[..n].copy_from_slice(&bytes[..n]);
    Value::Int(i64::from_le_bytes(a))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finished_containers_are_held_by_the_memo_alone() {
        // [{'k': 'N/A'}, ...] with every dict and string memoized, as a snapshot is.
        let mut bytes = b"\x80\x04]\x94(".to_vec();
        for _ in 0..1000 {
            bytes.extend_from_slice(b"}\x94\x8c\x01k\x94\x8c\x03N/A\x94s");
        }
        bytes.extend_from_slice(b"e.");
        let mut machine = Machine::new(SliceSource::new(&bytes), Limits::default(), None);
        let value = machine.run().unwrap_or(Value::None);
        assert_eq!(value.as_seq().map(<[Value]>::len), Some(1000));
        assert_eq!(machine.nodes.made, 1001);
        assert!(machine.nodes.open.is_empty() && machine.nodes.frozen_shared.is_empty());
        // Each finished dict's memo entry now holds the dict itself.
        assert!(matches!(
            machine.memo.get(1),
            Some(Slot::Val(Value::Dict(_), 1))
        ));
        // The 1000 'N/A' strings are one.
        let strs: Vec<&Value> = value
            .as_seq()
            .unwrap_or_default()
            .iter()
            .filter_map(|d| d.get("k"))
            .collect();
        assert!(strs
            .windows(2)
            .all(|w| matches!((w[0], w[1]), (Value::Str(a), Value::Str(b)) if Rc::ptr_eq(a, b))));
    }
}
