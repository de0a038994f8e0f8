//! Reading request bodies as strictly as the OpenAPI document describes them.
//!
//! serde's derive reads a struct from a JSON object, and also from a JSON array of its
//! fields in declaration order: `{"requests": 5, "period": "second"}` and `[5, "second"]`
//! are the same limit to it. The document says "object", so a client generated from it
//! never sends the array form, and a server that took it would accept what its contract
//! forbids (schemathesis found `"match": [null, null]` accepted as an empty match). This
//! deserializer over a [`serde_json::Value`] behaves as serde_json's own in every other
//! respect, and refuses an array where a struct is expected, at any depth.

use serde::de::value::StringDeserializer;
use serde::de::{
    self, DeserializeSeed, Deserializer, EnumAccess, IntoDeserializer, MapAccess, SeqAccess,
    Unexpected, VariantAccess, Visitor,
};
use serde_json::{Map, Value};

/// A JSON value read strictly (see the module documentation).
#[derive(Debug)]
pub struct Strict(pub Value);

type Error = serde_json::Error;

impl<'de> Deserializer<'de> for Strict {
    type Error = Error;

    fn deserialize_any<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Error> {
        match self.0 {
            Value::Array(items) => visitor.visit_seq(Items(items.into_iter())),
            Value::Object(fields) => visitor.visit_map(Fields {
                fields: fields.into_iter(),
                value: None,
            }),
            scalar => scalar.deserialize_any(visitor),
        }
    }

    fn deserialize_option<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Error> {
        match self.0 {
            Value::Null => visitor.visit_none(),
            value => visitor.visit_some(Strict(value)),
        }
    }

    fn deserialize_struct<V: Visitor<'de>>(
        self,
        _name: &'static str,
        _fields: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value, Error> {
        match self.0 {
            Value::Array(_) => Err(de::Error::invalid_type(Unexpected::Seq, &"an object")),
            value => Strict(value).deserialize_any(visitor),
        }
    }

    fn deserialize_enum<V: Visitor<'de>>(
        self,
        _name: &'static str,
        _variants: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value, Error> {
        match self.0 {
            // A unit variant: `"path"`.
            Value::String(variant) => visitor.visit_enum(Variant {
                name: variant,
                value: None,
            }),
            // A variant with content: `{"header": "x-api-key"}`.
            Value::Object(fields) if fields.len() == 1 => {
                let Some((name, value)) = fields.into_iter().next() else {
                    return Err(de::Error::invalid_length(0, &"one key"));
                };
                visitor.visit_enum(Variant {
                    name,
                    value: Some(value),
                })
            }
            other => Err(de::Error::invalid_type(
                unexpected(&other),
                &"a string or an object with one key",
            )),
        }
    }

    fn deserialize_newtype_struct<V: Visitor<'de>>(
        self,
        _name: &'static str,
        visitor: V,
    ) -> Result<V::Value, Error> {
        visitor.visit_newtype_struct(self)
    }

    serde::forward_to_deserialize_any! {
        bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char str string bytes
        byte_buf unit unit_struct seq tuple tuple_struct map identifier ignored_any
    }
}

fn unexpected(value: &Value) -> Unexpected<'_> {
    match value {
        Value::Null => Unexpected::Unit,
        Value::Bool(b) => Unexpected::Bool(*b),
        Value::Number(_) => Unexpected::Other("a number"),
        Value::String(s) => Unexpected::Str(s),
        Value::Array(_) => Unexpected::Seq,
        Value::Object(_) => Unexpected::Map,
    }
}

struct Items(std::vec::IntoIter<Value>);

impl<'de> SeqAccess<'de> for Items {
    type Error = Error;

    fn next_element_seed<T: DeserializeSeed<'de>>(
        &mut self,
        seed: T,
    ) -> Result<Option<T::Value>, Error> {
        self.0
            .next()
            .map(|v| seed.deserialize(Strict(v)))
            .transpose()
    }

    fn size_hint(&self) -> Option<usize> {
        Some(self.0.len())
    }
}

struct Fields {
    fields: <Map<String, Value> as IntoIterator>::IntoIter,
    value: Option<Value>,
}

impl<'de> MapAccess<'de> for Fields {
    type Error = Error;

    fn next_key_seed<K: DeserializeSeed<'de>>(
        &mut self,
        seed: K,
    ) -> Result<Option<K::Value>, Error> {
        let Some((key, value)) = self.fields.next() else {
            return Ok(None);
        };
        self.value = Some(value);
        let key: StringDeserializer<Error> = key.into_deserializer();
        seed.deserialize(key).map(Some)
    }

    fn next_value_seed<V: DeserializeSeed<'de>>(&mut self, seed: V) -> Result<V::Value, Error> {
        let value = self
            .value
            .take()
            .ok_or_else(|| de::Error::custom("a value was asked for before its key"))?;
        seed.deserialize(Strict(value))
    }
}

struct Variant {
    name: String,
    value: Option<Value>,
}

impl<'de> EnumAccess<'de> for Variant {
    type Error = Error;
    type Variant = Content;

    fn variant_seed<V: DeserializeSeed<'de>>(self, seed: V) -> Result<(V::Value, Content), Error> {
        let name: StringDeserializer<Error> = self.name.into_deserializer();
        Ok((seed.deserialize(name)?, Content(self.value)))
    }
}

/// What an enum variant holds (nothing for `"path"`).
struct Content(Option<Value>);

impl Content {
    fn value(self, expected: &str) -> Result<Value, Error> {
        self.0
            .ok_or_else(|| de::Error::invalid_type(Unexpected::UnitVariant, &expected))
    }
}

impl<'de> VariantAccess<'de> for Content {
    type Error = Error;

    fn unit_variant(self) -> Result<(), Error> {
        match self.0 {
            None | Some(Value::Null) => Ok(()),
            Some(other) => Err(de::Error::invalid_type(unexpected(&other), &"no content")),
        }
    }

    fn newtype_variant_seed<T: DeserializeSeed<'de>>(self, seed: T) -> Result<T::Value, Error> {
        seed.deserialize(Strict(self.value("a variant's content")?))
    }

    fn tuple_variant<V: Visitor<'de>>(self, _len: usize, visitor: V) -> Result<V::Value, Error> {
        Strict(self.value("a list")?).deserialize_any(visitor)
    }

    fn struct_variant<V: Visitor<'de>>(
        self,
        fields: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value, Error> {
        Strict(self.value("an object")?).deserialize_struct("", fields, visitor)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde::Deserialize;
    use serde_json::json;
    use sluice_core::spec::RuleSpec;

    fn strict<T: de::DeserializeOwned>(value: Value) -> Result<T, Error> {
        T::deserialize(Strict(value))
    }

    #[test]
    fn reads_every_rule_shape_as_serde_json_does() {
        let full = json!({
            "id": "i", "name": "n", "description": "d", "enabled": false, "priority": -3,
            "mode": "shadow",
            "match": {"host": "h", "path_exact": "/a", "path_prefix": "/", "path_regex": ".*",
                      "methods": ["GET"], "headers": [{"name": "x", "present": true, "equals": "y"}]},
            "key": {"composite": [{"header": "x"}, {"client_ip": {"trusted_hops": 1}}, "path"]},
            "limits": [{"requests": 1, "period": 5, "burst": 2, "scope": "global"},
                       {"requests": 7, "period": "minute", "soft_percent": 20}],
            "cost": {"header": {"name": "c", "max": 5, "default": 2}},
            "overrides": [{"client": "acme", "limits": [{"requests": 9, "period": "day"}]}],
            "failure_mode": null,
            "response": {"status": 503, "rate_limit_headers": false, "grpc_status": "unavailable"},
        });
        let loose: RuleSpec = serde_json::from_value(full.clone()).unwrap();
        let tight: RuleSpec = strict(full).unwrap();
        assert_eq!(
            serde_json::to_value(&loose).unwrap(),
            serde_json::to_value(&tight).unwrap()
        );
        for key in [
            json!("global"),
            json!({"query": "k"}),
            json!({"client_ip": {}}),
        ] {
            let rule = json!({"name": "n", "key": key, "limits": [{"requests": 1, "period": 1}]});
            assert!(strict::<RuleSpec>(rule).is_ok(), "{key}");
        }
    }

    #[test]
    fn refuses_an_array_where_an_object_belongs_at_any_depth() {
        let base =
            || json!({"name": "n", "key": "global", "limits": [{"requests": 1, "period": 1}]});
        let mut as_array = base();
        as_array["match"] = json!([null, null]);
        assert!(serde_json::from_value::<RuleSpec>(as_array.clone()).is_ok());
        let err = strict::<RuleSpec>(as_array).unwrap_err().to_string();
        assert!(err.contains("expected an object"), "{err}");
        let mut limit = base();
        limit["limits"] = json!([[1, 1]]);
        assert!(strict::<RuleSpec>(limit).is_err());
        let mut variant = base();
        variant["key"] = json!({"client_ip": [3]});
        assert!(strict::<RuleSpec>(variant).is_err());
        assert!(strict::<RuleSpec>(json!(["n", "global"])).is_err());
    }

    #[test]
    fn unknown_fields_and_wrong_types_still_fail_as_before() {
        #[derive(Debug, Deserialize)]
        #[serde(deny_unknown_fields)]
        #[allow(dead_code)]
        struct Small {
            a: u64,
            b: Option<String>,
        }
        assert!(strict::<Small>(json!({"a": 1, "b": null})).is_ok());
        assert!(strict::<Small>(json!({"a": 1, "c": 2})).is_err());
        assert!(strict::<Small>(json!({"a": "1"})).is_err());
        assert!(strict::<Small>(json!({"a": -1})).is_err());
    }
}
