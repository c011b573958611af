//! The pickle reader on pickles written by CPython (bytes captured once, below) and on
//! hand-made broken ones: every opcode of the subset, memo sharing, and each error.

#[path = "../../../tests/support/trace_support.rs"]
mod support;

use std::rc::Rc;

use support::{pickle, P};
use vramtop_trace::pickle::{from_slice, from_slice_with, Limits, PickleErrorKind, Value};

fn hex(text: &str) -> Vec<u8> {
    (0..text.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&text[i..i + 2], 16).unwrap_or(0))
        .collect()
}

// python3: base = {'ints': [0, 1, 255, 256, 65535, 65536, -1, -2**31, 2**31, 2**40,
//   -2**40, 2**63-1, -2**63, 2**64, -2**70], 'f': 1.5, 's': 'é✓', 't': (1, (2, 3), ()),
//   'n': None, 'yes': True, 'no': False, 'shared': [shared, shared]}, shared = ['x', 'y'];
// protocol 3 and 5 also get 'b': b'\x00\x01'; then pickle.dumps(base, protocol=p).hex()
const PROTO2: &str = "80027d7100285804000000696e747371015d7102284b004b014bff4d00014dffff4a000001004affffffff4a000000808a0500000080008a060000000000018a060000000000ff8a08ffffffffffffff7f8a0800000000000000808a090000000000000000018a090000000000000000c0655801000000667103473ff800000000000058010000007371045805000000c3a9e29c93710558010000007471064b014b024b038671072987710858010000006e71094e5803000000796573710a8858020000006e6f710b895806000000736861726564710c5d710d285d710e28580100000078710f580100000079711065680e65752e";
const PROTO3: &str = "80037d7100285804000000696e747371015d7102284b004b014bff4d00014dffff4a000001004affffffff4a000000808a0500000080008a060000000000018a060000000000ff8a08ffffffffffffff7f8a0800000000000000808a090000000000000000018a090000000000000000c0655801000000667103473ff800000000000058010000007371045805000000c3a9e29c93710558010000007471064b014b024b038671072987710858010000006e71094e5803000000796573710a8858020000006e6f710b895806000000736861726564710c5d710d285d710e28580100000078710f580100000079711065680e655801000000627111430200017112752e";
const PROTO5: &str = "800595ca000000000000007d94288c04696e7473945d94284b004b014bff4d00014dffff4a000001004affffffff4a000000808a0500000080008a060000000000018a060000000000ff8a08ffffffffffffff7f8a0800000000000000808a090000000000000000018a090000000000000000c0658c016694473ff80000000000008c0173948c05c3a9e29c93948c0174944b014b024b0386942987948c016e944e8c0379657394888c026e6f94898c06736861726564945d94285d94288c0178948c01799465680e658c0162944302000194752e";

fn check_cpython_object(v: &Value, with_bytes: bool) {
    let ints: Vec<Option<i64>> = v
        .get("ints")
        .and_then(Value::as_seq)
        .map(|s| s.iter().map(Value::as_int).collect())
        .unwrap_or_default();
    assert_eq!(
        ints,
        vec![
            Some(0),
            Some(1),
            Some(255),
            Some(256),
            Some(65535),
            Some(65536),
            Some(-1),
            Some(-(1 << 31)),
            Some(1 << 31),
            Some(1 << 40),
            Some(-(1 << 40)),
            Some(i64::MAX),
            Some(i64::MIN),
            None,
            None
        ]
    );
    let seq = v.get("ints").and_then(Value::as_seq).unwrap_or(&[]);
    assert!(matches!(&seq[13], Value::BigInt(b) if **b == [0, 0, 0, 0, 0, 0, 0, 0, 1]));
    assert!(matches!(&seq[14], Value::BigInt(_)));
    assert_eq!(v.get("f"), Some(&Value::Float(1.5)));
    assert_eq!(v.get("s").and_then(Value::as_str), Some("é✓"));
    assert_eq!(v.get("n"), Some(&Value::None));
    assert_eq!(v.get("yes"), Some(&Value::Bool(true)));
    assert_eq!(v.get("no"), Some(&Value::Bool(false)));
    let t = v.get("t").and_then(Value::as_seq).unwrap_or(&[]);
    assert_eq!(t.len(), 3);
    assert_eq!(t[1].as_seq().map(<[Value]>::len), Some(2));
    assert_eq!(t[2].as_seq().map(<[Value]>::len), Some(0));
    match v.get("shared").and_then(Value::as_seq) {
        Some([Value::List(a), Value::List(b)]) => {
            assert!(Rc::ptr_eq(a, b), "memoized list must be shared");
            assert_eq!(a[1].as_str(), Some("y"));
        }
        other => panic!("shared: {other:?}"),
    }
    if with_bytes {
        assert!(matches!(v.get("b"), Some(Value::Bytes(b)) if **b == [0, 1]));
    }
}

#[test]
fn reads_what_cpython_writes() {
    for (bytes, with_bytes) in [(PROTO2, false), (PROTO3, true), (PROTO5, true)] {
        match from_slice(&hex(bytes)) {
            Ok(v) => check_cpython_object(&v, with_bytes),
            Err(e) => panic!("{e}"),
        }
    }
}

#[test]
fn every_prefix_is_reported_as_truncated() {
    let full = hex(PROTO5);
    for cut in 0..full.len() {
        match from_slice(&full[..cut]) {
            Err(e) => assert_eq!(e.kind, PickleErrorKind::Truncated, "cut at {cut}: {e}"),
            Ok(v) => panic!("cut at {cut} parsed as {v:?}"),
        }
    }
}

fn error_of(bytes: &[u8]) -> String {
    match from_slice(bytes) {
        Err(e) => e.to_string(),
        Ok(v) => panic!("parsed as {v:?}"),
    }
}

#[test]
fn unsupported_opcode_is_named_with_its_offset() {
    let msg = error_of(b"\x80\x02c__builtin__\nset\n.");
    assert!(msg.contains("0x63 (GLOBAL) at byte 2"), "{msg}");
    let msg = error_of(b"\x80\x04\x8c\x01a\x8c\x01b\x93.");
    assert!(msg.contains("0x93 (STACK_GLOBAL) at byte 8"), "{msg}");
}

#[test]
fn structural_errors_are_reported() {
    assert!(error_of(b"\x80\x01N.").contains("protocol 1"));
    assert!(error_of(b"\x80\x04h\x05.").contains("memo entry 5"));
    assert!(error_of(b"\x80\x04s.").contains("malformed"));
    assert!(error_of(b"\x80\x04]K\x01K\x02s.").contains("not a dict"));
    assert!(error_of(b"\x80\x04}K\x01a.").contains("not a list"));
    assert!(error_of(b"\x80\x04.").contains("malformed"));
    assert!(error_of(b"\x80\x04e.").contains("MARK"));
    // A list that contains itself: l = []; l.append(l)
    assert!(error_of(b"\x80\x04]\x94h\x00a.").contains("contains itself"));
    // ... and through another: a = []; b = [a]; a.append(b), a fetched after it was finished.
    let cycle = hex("80025d71005d71016800613068006801612e");
    assert!(
        error_of(&cycle).contains("contains itself"),
        "{}",
        error_of(&cycle)
    );
    // BINUNICODE8 claiming 2^63 bytes: an error, not an allocation.
    let mut huge = b"\x80\x04\x8d".to_vec();
    huge.extend_from_slice(&(1u64 << 63).to_le_bytes());
    assert!(error_of(&huge).contains("ends early"));
}

fn nested_lists(depth: usize) -> Vec<u8> {
    let mut out = b"\x80\x04".to_vec();
    out.extend(std::iter::repeat_n(b']', depth));
    out.extend(std::iter::repeat_n(b'a', depth - 1));
    out.push(b'.');
    out
}

#[test]
fn limits_are_enforced() {
    let deep = nested_lists(200);
    assert!(error_of(&deep).contains("nesting depth"));
    let roomy = Limits {
        max_depth: 300,
        ..Limits::default()
    };
    assert!(from_slice_with(&deep, roomy).is_ok());

    let memo = Limits {
        max_memo: 2,
        scale_with_input: false,
        ..Limits::default()
    };
    let three = b"\x80\x04K\x01\x94K\x02\x94K\x03\x94.";
    assert!(from_slice_with(three, memo).is_err());
    assert!(from_slice(three).is_ok());

    let few_items = Limits {
        max_items: 10,
        scale_with_input: false,
        ..Limits::default()
    };
    let list = pickle(&P::List((0..20).map(P::Int).collect()));
    assert!(from_slice_with(&list, few_items).is_err());
}

#[test]
fn a_container_named_while_open_is_the_same_value_everywhere() {
    // [l, l, l] where l = [1] is fetched by GET from two memo entries while still open.
    let v = from_slice(b"\x80\x04(]q\x00q\x01K\x01ah\x00h\x01l.").unwrap_or(Value::None);
    let items = v.as_seq().unwrap_or_default();
    assert_eq!(items.len(), 3);
    for item in items {
        assert_eq!(item.as_seq().map(|l| l.to_vec()), Some(vec![Value::Int(1)]));
    }
    // [d, d] where d = {'a': 1} is copied by DUP while open.
    let v = from_slice(b"\x80\x04(}\x8c\x01aK\x01s2l.").unwrap_or(Value::None);
    let items = v.as_seq().unwrap_or_default();
    assert_eq!(items.len(), 2);
    assert!(items.iter().all(|d| d.get("a") == Some(&Value::Int(1))));
    // A memo entry read after its container was finished gives the finished container:
    // outer = []; inner = [7]; outer.append(inner); outer.append(<memo 0: inner>)
    let v = from_slice(b"\x80\x04]]\x94K\x07aah\x00a.").unwrap_or(Value::None);
    let inner = Value::List(Rc::new(vec![Value::Int(7)]));
    assert_eq!(
        v.as_seq().map(|l| l.to_vec()),
        Some(vec![inner.clone(), inner])
    );
}

#[test]
fn batched_appends_and_repeated_keys() {
    let big = pickle(&P::List((0..2500).map(P::Int).collect()));
    let v = from_slice(&big).unwrap_or(Value::None);
    assert_eq!(v.as_seq().map(<[Value]>::len), Some(2500));
    assert_eq!(v.as_seq().and_then(|s| s[2499].as_int()), Some(2499));

    // {'a': 1, 'a': 2} as SETITEMS writes it: Python keeps the last.
    let dup = b"\x80\x04}(\x8c\x01a\x94K\x01h\x00K\x02u.";
    let v = from_slice(dup).unwrap_or(Value::None);
    assert_eq!(v.get("a"), Some(&Value::Int(2)));
}
