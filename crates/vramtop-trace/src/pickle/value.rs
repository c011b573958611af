//! The values a pickle decodes to: Python's plain data (None, bool, int, float, str,
//! bytes, list, tuple, dict), with containers shared through `Rc`.

use std::rc::Rc;

/// A decoded pickle value. Containers are immutable and shared through `Rc`: an object
/// the pickle memoizes once and references many times is stored once.
#[derive(Clone, Debug, PartialEq)]
pub enum Value {
    None,
    Bool(bool),
    Int(i64),
    /// An integer outside `i64`, as little-endian two's complement bytes.
    BigInt(Rc<[u8]>),
    Float(f64),
    Str(Rc<str>),
    Bytes(Rc<[u8]>),
    List(Rc<Vec<Value>>),
    Tuple(Rc<Vec<Value>>),
    Dict(Rc<Dict>),
    /// A dict a `Reducer` took over while reading; the number is the reducer's own
    /// (an index into what it built).
    Reduced(u32),
}

/// A dict's entries in the order the pickle set them. A repeated key is kept twice;
/// `get` returns the last one, as Python's dict would.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Dict {
    /// Key, value, key, value: the arena's buffer, kept as it is to avoid a copy.
    flat: Vec<Value>,
}

impl Dict {
    /// Key, value, key, value; an odd last item is ignored.
    pub(super) fn from_flat(flat: Vec<Value>) -> Dict {
        Dict { flat }
    }

    pub fn from_pairs(pairs: impl IntoIterator<Item = (Value, Value)>) -> Dict {
        Dict {
            flat: pairs.into_iter().flat_map(|(k, v)| [k, v]).collect(),
        }
    }

    pub fn len(&self) -> usize {
        self.flat.len() / 2
    }

    pub fn is_empty(&self) -> bool {
        self.flat.is_empty()
    }

    pub fn iter(&self) -> impl DoubleEndedIterator<Item = (&Value, &Value)> {
        self.flat.chunks_exact(2).map(|kv| (&kv[0], &kv[1]))
    }

    /// The value under the string key `key`.
    pub fn get(&self, key: &str) -> Option<&Value> {
        self.iter()
            .rev()
            .find(|(k, _)| matches!(k, Value::Str(s) if &**s == key))
            .map(|(_, v)| v)
    }
}

impl Value {
    /// The value under the string key `key`, when `self` is a dict that has it.
    pub fn get(&self, key: &str) -> Option<&Value> {
        match self {
            Value::Dict(dict) => dict.get(key),
            _ => None,
        }
    }

    pub fn as_int(&self) -> Option<i64> {
        match self {
            Value::Int(i) => Some(*i),
            Value::Bool(b) => Some(i64::from(*b)),
            _ => None,
        }
    }

    pub fn as_str(&self) -> Option<&str> {
        match self {
            Value::Str(s) => Some(s),
            _ => None,
        }
    }

    pub fn as_bool(&self) -> Option<bool> {
        match self {
            Value::Bool(b) => Some(*b),
            _ => None,
        }
    }

    /// Items of a list or a tuple.
    pub fn as_seq(&self) -> Option<&[Value]> {
        match self {
            Value::List(items) | Value::Tuple(items) => Some(items),
            _ => None,
        }
    }

    pub fn as_dict(&self) -> Option<&Dict> {
        match self {
            Value::Dict(dict) => Some(dict),
            _ => None,
        }
    }

    /// What this is, in Python's words, for error messages ("a list of 3 items").
    pub fn describe(&self) -> String {
        match self {
            Value::None => "None".into(),
            Value::Bool(_) => "a bool".into(),
            Value::Int(_) | Value::BigInt(_) => "an int".into(),
            Value::Float(_) => "a float".into(),
            Value::Str(_) => "a str".into(),
            Value::Bytes(_) => "bytes".into(),
            Value::List(v) => format!("a list of {} items", v.len()),
            Value::Tuple(v) => format!("a tuple of {} items", v.len()),
            Value::Dict(v) => format!("a dict of {} keys", v.len()),
            Value::Reduced(_) => "a dict".into(),
        }
    }
}
