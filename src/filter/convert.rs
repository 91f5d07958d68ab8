//! JSON ⇄ Python values at the sandbox boundary. `MontyObject`'s own serde form is externally
//! tagged (`{"Int":42}`), so the mapping to plain JSON is written out here.

use monty_types::{DictPairs, MontyObject};
use serde_json::{Map, Number, Value};

/// A JSON value as a Python value (objects become dicts, in order).
pub fn to_py(v: &Value) -> MontyObject {
    match v {
        Value::Null => MontyObject::None,
        Value::Bool(b) => MontyObject::Bool(*b),
        Value::Number(n) => match (n.as_i64(), n.as_f64()) {
            (Some(i), _) => MontyObject::Int(i),
            (None, Some(f)) => MontyObject::Float(f),
            _ => MontyObject::String(n.to_string()),
        },
        Value::String(s) => MontyObject::String(s.clone()),
        Value::Array(a) => MontyObject::List(a.iter().map(to_py).collect()),
        Value::Object(o) => MontyObject::Dict(DictPairs::from(
            o.iter()
                .map(|(k, v)| (MontyObject::String(k.clone()), to_py(v)))
                .collect::<Vec<_>>(),
        )),
    }
}

/// A Python value as JSON: tuples and sets become lists, dict keys become strings, anything
/// without a JSON form becomes its `repr`.
pub fn to_json(o: &MontyObject) -> Value {
    to_json_at(o, 0)
}

/// Deeper values become their repr: JSON parsers (herald's own included) refuse very deep
/// nesting, and a filter's answer must always arrive.
const MAX_DEPTH: usize = 64;

fn to_json_at(o: &MontyObject, depth: usize) -> Value {
    if depth > MAX_DEPTH {
        return Value::String(o.to_string());
    }
    let to_json = |v: &MontyObject| to_json_at(v, depth + 1);
    match o {
        MontyObject::None => Value::Null,
        MontyObject::Bool(b) => Value::Bool(*b),
        MontyObject::Int(i) => Value::from(*i),
        MontyObject::Float(f) => Number::from_f64(*f).map_or(Value::Null, Value::Number),
        MontyObject::String(s) => Value::String(s.clone()),
        MontyObject::List(items)
        | MontyObject::Tuple(items)
        | MontyObject::Set(items)
        | MontyObject::FrozenSet(items) => Value::Array(items.iter().map(to_json).collect()),
        MontyObject::Dict(pairs) => {
            let mut m = Map::new();
            for (k, v) in pairs {
                let key = match k {
                    MontyObject::String(s) => s.clone(),
                    other => match to_json(other) {
                        Value::String(s) => s,
                        j => j.to_string(),
                    },
                };
                m.insert(key, to_json(v));
            }
            Value::Object(m)
        }
        other => Value::String(other.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn round_trip() {
        let v = json!({"a": [1, 2.5, "s", null, true], "b": {"c": {}}});
        assert_eq!(to_json(&to_py(&v)), v);
        assert_eq!(
            to_json(&MontyObject::Tuple(vec![
                MontyObject::Int(1),
                MontyObject::String("x".into())
            ])),
            json!([1, "x"])
        );
    }
}
