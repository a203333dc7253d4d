//! Reading lists and maps that a client controls without letting their length cost memory.
//!
//! A Balancer's lists and selectors have small limits (see the `api` module); a review or a
//! stored object can still carry hundreds of thousands of entries. These readers keep at
//! most the limit, count the rest without building anything (`IgnoredAny`), and then
//! fail with the exact count, so the error names the field and what it held.
//! They also refuse an array where the API has an object: serde's derived structs would
//! otherwise read a struct from an array of its fields.

use std::collections::BTreeMap;
use std::fmt;
use std::marker::PhantomData;

use serde::de::{self, Deserialize, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};

/// Reads `T` only from a JSON object.
pub(crate) struct ObjectOnly<T>(pub T);

impl<'de, T: Deserialize<'de>> Deserialize<'de> for ObjectOnly<T> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct ObjectVisitor<T>(PhantomData<T>);
        impl<'de, T: Deserialize<'de>> Visitor<'de> for ObjectVisitor<T> {
            type Value = T;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("an object")
            }
            fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<T, A::Error> {
                T::deserialize(de::value::MapAccessDeserializer::new(map))
            }
        }
        deserializer.deserialize_map(ObjectVisitor(PhantomData)).map(ObjectOnly)
    }
}

/// A list of objects with at most `max` items, named `what` in the error ("ports").
pub(crate) fn list<'de, D, T>(deserializer: D, max: usize, what: &'static str) -> Result<Vec<T>, D::Error>
where
    D: Deserializer<'de>,
    T: Deserialize<'de>,
{
    struct ListVisitor<T> {
        max: usize,
        what: &'static str,
        item: PhantomData<T>,
    }
    impl<'de, T: Deserialize<'de>> Visitor<'de> for ListVisitor<T> {
        type Value = Vec<T>;
        fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
            write!(f, "a list of at most {} {}", self.max, self.what)
        }
        fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<Vec<T>, A::Error> {
            read_seq(seq, self.max, self.what, |ObjectOnly(item): ObjectOnly<T>| item)
        }
    }
    deserializer.deserialize_seq(ListVisitor { max, what, item: PhantomData })
}

/// An optional list of strings (CIDRs, say) with at most `max` items, named `what` in the error.
pub(crate) fn optional_strings<'de, D>(
    deserializer: D,
    max: usize,
    what: &'static str,
) -> Result<Option<Vec<String>>, D::Error>
where
    D: Deserializer<'de>,
{
    struct StringsVisitor {
        max: usize,
        what: &'static str,
    }
    impl<'de> Visitor<'de> for StringsVisitor {
        type Value = Option<Vec<String>>;
        fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
            write!(f, "a list of at most {} {}", self.max, self.what)
        }
        fn visit_none<E: de::Error>(self) -> Result<Self::Value, E> {
            Ok(None)
        }
        fn visit_unit<E: de::Error>(self) -> Result<Self::Value, E> {
            Ok(None)
        }
        fn visit_some<D: Deserializer<'de>>(self, deserializer: D) -> Result<Self::Value, D::Error> {
            deserializer.deserialize_seq(self)
        }
        fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<Self::Value, A::Error> {
            read_seq(seq, self.max, self.what, |item: String| item).map(Some)
        }
    }
    deserializer.deserialize_option(StringsVisitor { max, what })
}

/// Keeps at most `max` items of `seq` (each read as `W`, kept as `T`), counts the rest.
fn read_seq<'de, A, W, T>(mut seq: A, max: usize, what: &str, keep: fn(W) -> T) -> Result<Vec<T>, A::Error>
where
    A: SeqAccess<'de>,
    W: Deserialize<'de>,
{
    let mut items = Vec::with_capacity(seq.size_hint().unwrap_or(0).min(max));
    while items.len() < max {
        match seq.next_element::<W>()? {
            Some(item) => items.push(keep(item)),
            None => return Ok(items),
        }
    }
    let extra = count_rest(&mut seq)?;
    if extra == 0 {
        return Ok(items);
    }
    Err(too_many(max, max + extra, what))
}

/// An optional string-to-string map (a selector): `null` and a missing field are `None`.
pub(crate) fn optional_string_map<'de, D>(
    deserializer: D,
    max: usize,
    what: &'static str,
) -> Result<Option<BTreeMap<String, String>>, D::Error>
where
    D: Deserializer<'de>,
{
    optional_map(deserializer, max, what)
}

fn count_rest<'de, A: SeqAccess<'de>>(seq: &mut A) -> Result<usize, A::Error> {
    let mut extra = 0usize;
    while seq.next_element::<IgnoredAny>()?.is_some() {
        extra += 1;
    }
    Ok(extra)
}

fn too_many<E: de::Error>(max: usize, got: usize, what: &str) -> E {
    E::custom(format_args!("must have at most {max} {what}, got {got}"))
}

/// A JSON object (or `null`) with at most `max` entries, each value read as `V`, named `what`
/// in the error: a map of many tiny keys costs no more than `max` entries before it is refused.
pub(crate) fn optional_map<'de, D, V>(
    deserializer: D,
    max: usize,
    what: &'static str,
) -> Result<Option<BTreeMap<String, V>>, D::Error>
where
    D: Deserializer<'de>,
    V: Deserialize<'de>,
{
    struct OptionVisitor<V> {
        max: usize,
        what: &'static str,
        value: PhantomData<V>,
    }
    impl<'de, V: Deserialize<'de>> Visitor<'de> for OptionVisitor<V> {
        type Value = Option<BTreeMap<String, V>>;
        fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
            write!(f, "a map of at most {} {}", self.max, self.what)
        }
        fn visit_none<E: de::Error>(self) -> Result<Self::Value, E> {
            Ok(None)
        }
        fn visit_unit<E: de::Error>(self) -> Result<Self::Value, E> {
            Ok(None)
        }
        fn visit_some<D: Deserializer<'de>>(self, deserializer: D) -> Result<Self::Value, D::Error> {
            deserializer.deserialize_map(self)
        }
        fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
            let mut entries = BTreeMap::new();
            // Every key read counts towards `max`, repeated keys too: a repeated key adds no
            // entry, but reading it still costs time.
            let mut seen = 0usize;
            while let Some(key) = map.next_key::<String>()? {
                if seen == self.max {
                    let mut extra = 1usize;
                    map.next_value::<IgnoredAny>()?;
                    while map.next_entry::<IgnoredAny, IgnoredAny>()?.is_some() {
                        extra += 1;
                    }
                    return Err(too_many(self.max, self.max + extra, self.what));
                }
                let value = map.next_value::<V>()?;
                entries.insert(key, value);
                seen += 1;
            }
            Ok(Some(entries))
        }
    }
    deserializer.deserialize_option(OptionVisitor { max, what, value: PhantomData })
}

/// The items of a JSON array, each as its text, when there are at most `max` of them; `None`
/// when there are more (they are counted, not kept).
pub(crate) fn raw_items(
    text: &str,
    max: usize,
) -> Result<Option<Vec<&serde_json::value::RawValue>>, serde_json::Error> {
    struct ItemsVisitor {
        max: usize,
    }
    impl<'de> Visitor<'de> for ItemsVisitor {
        type Value = Option<Vec<&'de serde_json::value::RawValue>>;
        fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
            f.write_str("a list")
        }
        fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
            let mut items = Vec::new();
            while let Some(item) = seq.next_element()? {
                if items.len() == self.max {
                    count_rest(&mut seq)?;
                    return Ok(None);
                }
                items.push(item);
            }
            Ok(Some(items))
        }
    }
    let mut deserializer = serde_json::Deserializer::from_str(text);
    let items = deserializer.deserialize_seq(ItemsVisitor { max })?;
    deserializer.end()?;
    Ok(items)
}

/// An optional `T` (a Kubernetes type such as `Affinity`) read from at most `max` JSON values
/// in all (each object, list, key, string, number…), named `what` in the error; `null` and a
/// missing field are `None`. The JSON values are counted as they are read, so a client cannot
/// inflate a small type with many tiny objects. Only a value within the count is turned into
/// `T`, whose own errors name the field inside
/// (`nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution: …`).
pub(crate) fn optional_capped<'de, D, T>(deserializer: D, max: usize, what: &'static str) -> Result<Option<T>, D::Error>
where
    D: Deserializer<'de>,
    T: de::DeserializeOwned,
{
    let budget = std::cell::Cell::new(max);
    let value = de::DeserializeSeed::deserialize(Counted { budget: &budget, max, what }, deserializer)?;
    if value.is_null() {
        return Ok(None);
    }
    serde_path_to_error::deserialize(value).map(Some).map_err(|e| {
        let path = e.path().to_string();
        match path.as_str() {
            "." => de::Error::custom(e.into_inner()),
            _ => de::Error::custom(format_args!("{path}: {}", e.into_inner())),
        }
    })
}

/// Reads any JSON value, spending one of `budget` per value and per key.
struct Counted<'a> {
    budget: &'a std::cell::Cell<usize>,
    max: usize,
    what: &'static str,
}

impl Counted<'_> {
    fn spend<E: de::Error>(&self) -> Result<(), E> {
        match self.budget.get() {
            0 => Err(E::custom(format_args!("must have at most {} {} in all", self.max, self.what))),
            left => {
                self.budget.set(left - 1);
                Ok(())
            }
        }
    }

    fn again(&self) -> Self {
        Counted { budget: self.budget, max: self.max, what: self.what }
    }
}

impl<'de> de::DeserializeSeed<'de> for Counted<'_> {
    type Value = serde_json::Value;
    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<Self::Value, D::Error> {
        deserializer.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for Counted<'_> {
    type Value = serde_json::Value;
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        write!(f, "at most {} {}", self.max, self.what)
    }
    fn visit_unit<E: de::Error>(self) -> Result<Self::Value, E> {
        Ok(serde_json::Value::Null)
    }
    fn visit_none<E: de::Error>(self) -> Result<Self::Value, E> {
        Ok(serde_json::Value::Null)
    }
    fn visit_some<D: Deserializer<'de>>(self, deserializer: D) -> Result<Self::Value, D::Error> {
        deserializer.deserialize_any(self)
    }
    fn visit_bool<E: de::Error>(self, v: bool) -> Result<Self::Value, E> {
        self.spend()?;
        Ok(v.into())
    }
    fn visit_i64<E: de::Error>(self, v: i64) -> Result<Self::Value, E> {
        self.spend()?;
        Ok(v.into())
    }
    fn visit_u64<E: de::Error>(self, v: u64) -> Result<Self::Value, E> {
        self.spend()?;
        Ok(v.into())
    }
    fn visit_f64<E: de::Error>(self, v: f64) -> Result<Self::Value, E> {
        self.spend()?;
        Ok(serde_json::Number::from_f64(v).map_or(serde_json::Value::Null, serde_json::Value::Number))
    }
    fn visit_str<E: de::Error>(self, v: &str) -> Result<Self::Value, E> {
        self.spend()?;
        Ok(v.into())
    }
    fn visit_string<E: de::Error>(self, v: String) -> Result<Self::Value, E> {
        self.spend()?;
        Ok(v.into())
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
        self.spend()?;
        let mut items = Vec::new();
        while let Some(item) = seq.next_element_seed(self.again())? {
            items.push(item);
        }
        Ok(serde_json::Value::Array(items))
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        self.spend()?;
        let mut entries = serde_json::Map::new();
        while let Some(key) = map.next_key::<String>()? {
            self.spend()?;
            let value = map.next_value_seed(self.again())?;
            entries.insert(key, value);
        }
        Ok(serde_json::Value::Object(entries))
    }
}
