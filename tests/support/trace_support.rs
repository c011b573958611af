//! Test support for the trace tests, included with `#[path]`: a small pickle writer
//! (protocol 4, memoizing strings like Python's pickler) and builders for fake PyTorch
//! snapshots, so tests need neither python nor real files.
#![allow(dead_code)]

use std::collections::HashMap;

/// A value to pickle.
#[derive(Clone, Debug)]
pub enum P {
    None,
    Bool(bool),
    Int(i64),
    Float(f64),
    Str(String),
    Bytes(Vec<u8>),
    List(Vec<P>),
    Tuple(Vec<P>),
    Dict(Vec<(P, P)>),
    /// BINGET of memo index n (refers to an earlier object).
    Get(u32),
}

pub fn s(text: &str) -> P {
    P::Str(text.to_string())
}

pub fn dict(pairs: Vec<(&str, P)>) -> P {
    P::Dict(pairs.into_iter().map(|(k, v)| (s(k), v)).collect())
}

pub struct Encoder {
    out: Vec<u8>,
    memo: u32,
    strings: HashMap<String, u32>,
    /// MEMOIZE after lists, dicts and tuples too (Python's pickler does).
    memo_containers: bool,
}

/// Pickles `value` with protocol 4, one FRAME, MEMOIZE after every string and container.
pub fn pickle(value: &P) -> Vec<u8> {
    encode(value, true)
}

/// As `pickle`, but containers are not memoized: what `pickletools.optimize` leaves of a
/// pickle whose containers are each used once.
pub fn pickle_unmemoized_containers(value: &P) -> Vec<u8> {
    encode(value, false)
}

fn encode(value: &P, memo_containers: bool) -> Vec<u8> {
    let mut enc = Encoder {
        out: Vec::new(),
        memo: 0,
        strings: HashMap::new(),
        memo_containers,
    };
    enc.value(value);
    let body = std::mem::take(&mut enc.out);
    let mut out = vec![0x80, 4, 0x95];
    out.extend_from_slice(&(body.len() as u64 + 1).to_le_bytes());
    out.extend_from_slice(&body);
    out.push(b'.');
    out
}

impl Encoder {
    fn memoize(&mut self) {
        self.out.push(0x94);
        self.memo += 1;
    }

    fn memoize_container(&mut self) {
        if self.memo_containers {
            self.memoize();
        }
    }

    fn get(&mut self, index: u32) {
        if index < 256 {
            self.out.extend_from_slice(&[b'h', index as u8]);
        } else {
            self.out.push(b'j');
            self.out.extend_from_slice(&index.to_le_bytes());
        }
    }

    fn int(&mut self, i: i64) {
        if (0..256).contains(&i) {
            self.out.extend_from_slice(&[b'K', i as u8]);
        } else if (0..65536).contains(&i) {
            self.out.push(b'M');
            self.out.extend_from_slice(&(i as u16).to_le_bytes());
        } else if i32::try_from(i).is_ok() {
            self.out.push(b'J');
            self.out.extend_from_slice(&(i as i32).to_le_bytes());
        } else {
            // LONG1 with the shortest two's complement encoding.
            let bytes = i.to_le_bytes();
            let mut n = 8;
            while n > 1 {
                let top = bytes[n - 1];
                let next_sign = bytes[n - 2] & 0x80;
                if (top == 0 && next_sign == 0) || (top == 0xff && next_sign != 0) {
                    n -= 1;
                } else {
                    break;
                }
            }
            self.out.extend_from_slice(&[0x8a, n as u8]);
            self.out.extend_from_slice(&bytes[..n]);
        }
    }

    fn value(&mut self, v: &P) {
        match v {
            P::None => self.out.push(b'N'),
            P::Bool(b) => self.out.push(if *b { 0x88 } else { 0x89 }),
            P::Int(i) => self.int(*i),
            P::Float(f) => {
                self.out.push(b'G');
                self.out.extend_from_slice(&f.to_be_bytes());
            }
            P::Str(text) => {
                if let Some(&index) = self.strings.get(text) {
                    self.get(index);
                    return;
                }
                if text.len() < 256 {
                    self.out.extend_from_slice(&[0x8c, text.len() as u8]);
                } else {
                    self.out.push(b'X');
                    self.out
                        .extend_from_slice(&(text.len() as u32).to_le_bytes());
                }
                self.out.extend_from_slice(text.as_bytes());
                self.strings.insert(text.clone(), self.memo);
                self.memoize();
            }
            P::Bytes(b) => {
                self.out.push(b'B');
                self.out.extend_from_slice(&(b.len() as u32).to_le_bytes());
                self.out.extend_from_slice(b);
            }
            P::List(items) => {
                self.out.push(b']');
                self.memoize_container();
                for batch in items.chunks(1000) {
                    if batch.len() == 1 {
                        self.value(&batch[0]);
                        self.out.push(b'a');
                    } else {
                        self.out.push(b'(');
                        for item in batch {
                            self.value(item);
                        }
                        self.out.push(b'e');
                    }
                }
            }
            P::Tuple(items) => {
                match items.len() {
                    0 => self.out.push(b')'),
                    1..=3 => {
                        for item in items {
                            self.value(item);
                        }
                        self.out.push(0x84 + items.len() as u8);
                    }
                    _ => {
                        self.out.push(b'(');
                        for item in items {
                            self.value(item);
                        }
                        self.out.push(b't');
                    }
                }
                self.memoize_container();
            }
            P::Dict(pairs) => {
                self.out.push(b'}');
                self.memoize_container();
                if pairs.len() == 1 {
                    self.value(&pairs[0].0);
                    self.value(&pairs[0].1);
                    self.out.push(b's');
                } else if !pairs.is_empty() {
                    self.out.push(b'(');
                    for (k, v) in pairs {
                        self.value(k);
                        self.value(v);
                    }
                    self.out.push(b'u');
                }
            }
            P::Get(index) => self.get(*index),
        }
    }
}

pub fn frame(file: &str, line: i64, name: &str) -> P {
    dict(vec![
        ("filename", s(file)),
        ("line", P::Int(line)),
        ("name", s(name)),
    ])
}

/// A trace entry as `_snapshot()` writes it.
pub fn event(action: &str, addr: i64, size: i64, frames: Vec<P>) -> P {
    dict(vec![
        ("action", s(action)),
        ("addr", P::Int(addr)),
        ("compile_context", s("N/A")),
        ("frames", P::List(frames)),
        ("size", P::Int(size)),
        ("stream", P::Int(0)),
        ("time_us", P::Int(1_795_321_078_558_603)),
        ("user_metadata", s("")),
    ])
}

/// A block inside a segment.
pub fn block(addr: i64, size: i64, state: &str) -> P {
    dict(vec![
        ("address", P::Int(addr)),
        ("frames", P::List(vec![])),
        ("requested_size", P::Int(size)),
        ("size", P::Int(size)),
        ("state", s(state)),
    ])
}

pub fn segment(addr: i64, total: i64, blocks: Vec<P>) -> P {
    dict(vec![
        ("address", P::Int(addr)),
        ("total_size", P::Int(total)),
        ("allocated_size", P::Int(0)),
        ("device", P::Int(0)),
        ("stream", P::Int(0)),
        ("segment_type", s("large")),
        ("segment_pool_id", P::Tuple(vec![P::Int(0), P::Int(0)])),
        ("is_expandable", P::Bool(false)),
        ("frames", P::List(vec![])),
        ("blocks", P::List(blocks)),
    ])
}

pub fn snapshot(segments: Vec<P>, traces: Vec<Vec<P>>) -> P {
    dict(vec![
        ("segments", P::List(segments)),
        (
            "device_traces",
            P::List(traces.into_iter().map(P::List).collect()),
        ),
        (
            "allocator_settings",
            dict(vec![("max_split_size", P::Int(-1))]),
        ),
        ("external_annotations", P::List(vec![])),
    ])
}

/// A small but complete snapshot: a parameter live from the start, a leaked block,
/// a freed block, an unknown action and a free of an unknown address.
pub fn small_snapshot() -> P {
    let user = || {
        vec![
            frame("torch/nn/modules/linear.py", 134, "forward"),
            frame("train.py", 68, "step"),
        ]
    };
    let base: i64 = 0x7f00_0000_0000;
    snapshot(
        vec![segment(
            base,
            2 << 20,
            vec![
                block(base, 1 << 20, "active_allocated"),
                block(base + (1 << 20), 4096, "active_allocated"),
                block(base + (1 << 20) + 4096, (1 << 20) - 4096, "inactive"),
            ],
        )],
        vec![vec![
            event("segment_alloc", base, 2 << 20, user()),
            event("alloc", base + (1 << 20), 4096, user()),
            event("alloc", base + (1 << 20) + 4096, 1000, user()),
            event("free_requested", base + (1 << 20) + 4096, 1000, vec![]),
            event("free_completed", base + (1 << 20) + 4096, 1000, vec![]),
            event("mystery_action", 0, 0, vec![]),
            event("free_completed", 0x1234, 512, vec![]),
        ]],
    )
}

/// A gzipped fixture unzipped into a fresh folder of its own, under the name the hook gives
/// the files it keeps (`vramtop-oom-NAME-4242-1.pickle`: the live view opens no other):
/// (the folder, the file). Each call gets its own folder, as tests run side by side and
/// each removes its own.
pub fn unzipped_as_kept(
    gz: &std::path::Path,
    name: &str,
) -> (std::path::PathBuf, std::path::PathBuf) {
    use std::sync::atomic::{AtomicUsize, Ordering};
    static CALLS: AtomicUsize = AtomicUsize::new(0);
    let call = CALLS.fetch_add(1, Ordering::Relaxed);
    let dir =
        std::env::temp_dir().join(format!("vramtop-kept-{}-{call}-{name}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join(format!("vramtop-oom-{name}-4242-1.pickle"));
    let mut bytes = Vec::new();
    std::io::Read::read_to_end(
        &mut flate2::read::GzDecoder::new(std::fs::File::open(gz).unwrap()),
        &mut bytes,
    )
    .unwrap();
    std::fs::write(&path, bytes).unwrap();
    (dir, path)
}
