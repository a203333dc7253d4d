//! v1alpha1 ↔ v1beta1, losslessly, for `POST /convert` and `balancer convert`.
//!
//! The API server converts every object it stores (v1beta1) to the version a client asks
//! for, and back. The conversion must never lose a field, or a read-modify-write through
//! v1alpha1 (a Go-era manifest re-applied, say) would reset what only v1beta1 can say.
//! So, as the kubebuilder tutorial does, the v1beta1-only spec fields ride along in an
//! annotation on the v1alpha1 object ([`PRESERVED_ANNOTATION`]) and come back from it.
//!
//! The status fields only v1beta1 has (`replicas`, `readyReplicas`, `selector`, `addresses`,
//! `nodePorts`, `backends`, `backendsReady`, `configuredReplicas`) are derived
//! by the controller, which writes them again; they are left out of v1alpha1 and never read
//! from the annotation, so that a client who may update Balancers, but not their status,
//! cannot set them (a HorizontalPodAutoscaler reads `selector`).
//!
//! Objects are converted as JSON text, field by field at the top levels only: everything
//! the conversion does not touch is copied through verbatim and never parsed into a tree,
//! so a stored object is converted even when its spec would not pass the rules (an
//! unreadable object must stay readable, or one bad Balancer would fail every list), and a
//! large object costs about its own size in memory. The levels that are read are bounded
//! (fields, annotations, list items), so many tiny keys cannot cost more.
//!
//! Both directions of the mapping, and the annotation that carries what v1alpha1 cannot
//! express, live in this one module because they must change together.

use std::collections::BTreeMap;

use serde::Serialize;
use serde_json::value::{RawValue, to_raw_value};

use super::{GROUP, v1alpha1, v1beta1};

/// The annotation that carries, on a v1alpha1 object, the spec fields only v1beta1 has:
/// `{"spec":{…},"items":{"ports":{"80/TCP":{…}},"backends":{"v1":{…}}}}`, as JSON.
pub const PRESERVED_ANNOTATION: &str = "exposer.hliangzhao.io/v1beta1-fields";

/// The spec fields both versions have; every other spec field is v1beta1's alone.
const SHARED_SPEC_FIELDS: [&str; 3] = ["ports", "selector", "backends"];
/// Status fields renamed between the versions, as (v1alpha1, v1beta1).
const RENAMED_STATUS_FIELDS: [(&str, &str); 2] =
    [("activeBackendsNum", "activeBackends"), ("obsoleteBackendsNum", "obsoleteBackends")];
/// The lists whose items' v1beta1-only fields travel in the annotation, each item found by its
/// list-map key: (list, the fields its items have in v1alpha1, the function giving an item's key).
const ITEM_LISTS: [ItemList; 2] = [
    ("ports", &["name", "protocol", "port", "targetPort"], port_key),
    ("backends", &["name", "weight", "selector"], backend_key),
];

/// A keyed list in `spec`: its name, the fields its items have in v1alpha1, and the function
/// giving an item's key.
type ItemList = (&'static str, &'static [&'static str], fn(&Fields<'_>) -> Option<String>);

/// `<port>/<protocol>` (protocol defaulted to TCP, as the v1beta1 schema does).
fn port_key(item: &Fields<'_>) -> Option<String> {
    let port: i64 = serde_json::from_str(item.get("port")?.text()).ok()?;
    let protocol = match item.get("protocol") {
        Some(piece) => serde_json::from_str::<Option<String>>(piece.text()).ok()?,
        None => None,
    };
    Some(format!("{port}/{}", protocol.as_deref().unwrap_or("TCP")))
}

fn backend_key(item: &Fields<'_>) -> Option<String> {
    serde_json::from_str(item.get("name")?.text()).ok()
}

/// Items' v1beta1-only fields, by list, then by item key.
type ItemFields<T> = BTreeMap<String, BTreeMap<String, T>>;

/// The status fields both versions have (by their v1alpha1 names).
const SHARED_STATUS_FIELDS: [&str; 4] =
    ["activeBackendsNum", "obsoleteBackendsNum", "observedGeneration", "conditions"];

/// A served version of the Balancer API.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Version {
    /// `exposer.hliangzhao.io/v1alpha1`, the Go project's.
    V1alpha1,
    /// `exposer.hliangzhao.io/v1beta1`, the stored version.
    V1beta1,
}

impl Version {
    /// The version named by a full `apiVersion` (`exposer.hliangzhao.io/v1beta1`).
    pub fn from_api_version(api_version: &str) -> Option<Self> {
        match api_version.strip_prefix(GROUP)?.strip_prefix('/')? {
            v1alpha1::VERSION => Some(Version::V1alpha1),
            v1beta1::VERSION => Some(Version::V1beta1),
            _ => None,
        }
    }

    /// `exposer.hliangzhao.io/<version>`.
    pub fn api_version(self) -> String {
        let version = match self {
            Version::V1alpha1 => v1alpha1::VERSION,
            Version::V1beta1 => v1beta1::VERSION,
        };
        format!("{GROUP}/{version}")
    }
}

/// Why an object cannot be converted.
#[allow(missing_docs, reason = "each variant's #[error] message says what it is, naming its fields")]
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ConversionError {
    #[error("not a JSON object with an apiVersion: {0}")]
    NotAnObject(String),
    #[error("apiVersion {0:?} is not a served version of {GROUP} Balancers (v1alpha1, v1beta1)")]
    UnknownVersion(String),
    #[error("{field}: {reason}")]
    Field { field: &'static str, reason: String },
}

/// One field's value: the text it had in the object (borrowed, never copied), or a new one.
#[derive(Debug)]
enum Piece<'a> {
    Text(&'a RawValue),
    New(Box<RawValue>),
}

impl Serialize for Piece<'_> {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        match self {
            Piece::Text(text) => text.serialize(serializer),
            Piece::New(text) => text.serialize(serializer),
        }
    }
}

/// Fields of one JSON object, each kept as its own text.
type Fields<'a> = BTreeMap<String, Piece<'a>>;

/// The v1beta1-only fields of one object, as the annotation carries them.
#[derive(Default, serde::Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
struct Preserved {
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    spec: BTreeMap<String, Box<RawValue>>,
    /// Per list item (`ports` by `<port>/<protocol>`, `backends` by name).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    items: ItemFields<BTreeMap<String, Box<RawValue>>>,
}

/// Converts one Balancer, given as JSON text, to `to`; an object already at `to` comes back as it is.
pub fn convert(object: &RawValue, to: Version) -> Result<Box<RawValue>, ConversionError> {
    let mut out = Vec::with_capacity(object.get().len() + 64);
    convert_into(object, to, &mut out)?;
    let text = String::from_utf8(out).map_err(|e| bad_field("object", e))?;
    RawValue::from_string(text).map_err(|e| bad_field("object", e))
}

/// [`convert`], writing the converted object's JSON at the end of `out`: the object's text is
/// read in place, and only the fields that change are written anew.
pub fn convert_into(object: &RawValue, to: Version, out: &mut Vec<u8>) -> Result<(), ConversionError> {
    let mut fields = parse_fields(object)
        .map_err(|e| ConversionError::NotAnObject(e.to_string()))?
        .ok_or_else(|| ConversionError::NotAnObject("null".into()))?;
    let api_version: String = match fields.get("apiVersion") {
        Some(Piece::Text(raw)) => {
            serde_json::from_str(raw.get()).map_err(|e| ConversionError::NotAnObject(e.to_string()))?
        }
        _ => return Err(ConversionError::NotAnObject("apiVersion is missing".into())),
    };
    let from = Version::from_api_version(&api_version).ok_or(ConversionError::UnknownVersion(api_version))?;
    if from == to {
        out.extend_from_slice(object.get().as_bytes());
        return Ok(());
    }
    match to {
        Version::V1beta1 => to_v1beta1(&mut fields)?,
        Version::V1alpha1 => to_v1alpha1(&mut fields)?,
    }
    fields.insert("apiVersion".into(), encoded(&to.api_version())?);
    serde_json::to_writer(out, &fields).map_err(|e| bad_field("object", e))
}

/// v1alpha1 → v1beta1: the annotation's fields come back; status counts are renamed. Only a
/// field that changes is written anew: a large spec is copied once, into the answer.
fn to_v1beta1(object: &mut Fields<'_>) -> Result<(), ConversionError> {
    let preserved = take_preserved(object)?;
    if !preserved.spec.is_empty() || !preserved.items.is_empty() {
        let mut spec = object_field(object, "spec")?;
        if let Some(spec) = &mut spec {
            restore_items(spec, preserved.items)?;
        }
        // A field v1alpha1 has itself wins over one of the same name in the annotation.
        merge_missing(object, "spec", &mut spec, preserved.spec)?;
        put_back(object, "spec", spec)?;
    }
    let mut status = object_field(object, "status")?;
    if status.as_mut().is_some_and(|status| rename(status, RENAMED_STATUS_FIELDS)) {
        put_back(object, "status", status)?;
    }
    Ok(())
}

/// v1beta1 → v1alpha1: spec fields v1alpha1 lacks move into the annotation; counts get their
/// old names; derived status fields v1alpha1 lacks are dropped.
fn to_v1alpha1(object: &mut Fields<'_>) -> Result<(), ConversionError> {
    let mut spec = object_field(object, "spec")?;
    let mut status = object_field(object, "status")?;
    let moved_items = match spec.as_mut() {
        Some(spec) => split_items(spec)?,
        None => ItemFields::new(),
    };
    let moved_spec = spec.as_mut().map(|spec| split_off(spec, |name| SHARED_SPEC_FIELDS.contains(&name)));
    let mut renamed = false;
    // Derived status fields v1alpha1 lacks are dropped, not moved (see the module's doc).
    let moved_status = status.as_mut().map(|status| {
        renamed = rename(status, RENAMED_STATUS_FIELDS.map(|(alpha, beta)| (beta, alpha)));
        split_off(status, |name| SHARED_STATUS_FIELDS.contains(&name))
    });
    let (moved_spec, moved_status) = (moved_spec.unwrap_or_default(), moved_status.unwrap_or_default());
    // A spec or status that the move left empty held only v1beta1 fields: it is removed, not
    // written as `{}`.
    let emptied = |map: &Option<Fields<'_>>, moved: &Fields<'_>| {
        map.as_ref().is_some_and(BTreeMap::is_empty) && !moved.is_empty()
    };
    if emptied(&spec, &moved_spec) {
        spec = None;
    }
    if emptied(&status, &moved_status) {
        status = None;
    }
    if !moved_spec.is_empty() || !moved_items.is_empty() {
        put_back(object, "spec", spec)?;
    }
    if renamed || !moved_status.is_empty() {
        put_back(object, "status", status)?;
    }
    // An annotation of this name on a v1beta1 object has no meaning, so it is overwritten: the
    // result holds exactly the fields this conversion moved, or no annotation at all.
    let text = if moved_spec.is_empty() && moved_items.is_empty() {
        None
    } else {
        let moved = Moved { spec: moved_spec, items: moved_items };
        Some(serde_json::to_string(&moved).map_err(|e| bad_field("metadata.annotations", e))?)
    };
    set_annotation(object, text)
}

/// The annotation's content as written: the moved fields, borrowed.
#[derive(Serialize)]
struct Moved<'a> {
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    spec: Fields<'a>,
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    items: ItemFields<Fields<'a>>,
}

/// Moves the v1beta1-only fields of `spec`'s list items out, keyed by list and item; rewrites
/// only the lists that had some. Items that are not objects, or have no key, stay as they are.
fn split_items<'a>(spec: &mut Fields<'a>) -> Result<ItemFields<Fields<'a>>, ConversionError> {
    let mut moved = ItemFields::new();
    for (list, shared, key) in ITEM_LISTS {
        let Some(Piece::Text(text)) = spec.get(list) else { continue };
        let Ok(Some(items)) = crate::util::bounded::raw_items(text.get(), MAX_ITEMS) else { continue };
        let mut rewritten = Vec::with_capacity(items.len());
        let mut by_key = BTreeMap::new();
        for item in items {
            match parse_fields(item) {
                Ok(Some(mut fields)) => match key(&fields) {
                    Some(k) => {
                        let extra = split_off(&mut fields, |name| shared.contains(&name));
                        if !extra.is_empty() {
                            by_key.insert(k, extra);
                        }
                        rewritten.push(encoded(&fields)?);
                    }
                    None => rewritten.push(Piece::Text(item)),
                },
                _ => rewritten.push(Piece::Text(item)),
            }
        }
        if !by_key.is_empty() {
            spec.insert(list.into(), encoded(&rewritten)?);
            moved.insert(list.to_string(), by_key);
        }
    }
    Ok(moved)
}

/// Puts the annotation's item fields back into the items of `spec`'s lists with the same key
/// (an item's own field wins).
fn restore_items(
    spec: &mut Fields<'_>,
    mut items: ItemFields<BTreeMap<String, Box<RawValue>>>,
) -> Result<(), ConversionError> {
    for (list, _, key) in ITEM_LISTS {
        let Some(mut by_key) = items.remove(list) else { continue };
        let Some(piece) = spec.get(list) else { continue };
        let Ok(Some(texts)) = crate::util::bounded::raw_items(piece.text(), MAX_ITEMS) else { continue };
        let mut rewritten = Vec::with_capacity(texts.len());
        for text in texts {
            let mut fields = match parse_fields(text) {
                Ok(Some(fields)) => fields,
                _ => {
                    rewritten.push(encoded(text)?);
                    continue;
                }
            };
            if let Some(extra) = key(&fields).and_then(|k| by_key.remove(&k)) {
                for (name, value) in extra {
                    fields.entry(name).or_insert(Piece::New(value));
                }
            }
            rewritten.push(encoded(&fields)?);
        }
        spec.insert(list.into(), encoded(&rewritten)?);
    }
    Ok(())
}

/// Removes and reads the annotation. One that does not read as ours is left in place
/// untouched (nothing is lost), and nothing is restored from it.
fn take_preserved(object: &mut Fields<'_>) -> Result<Preserved, ConversionError> {
    let Some(mut annotations) = annotations(object)? else { return Ok(Preserved::default()) };
    let Some(text) = annotations.get(PRESERVED_ANNOTATION).filter(|text| text.len() <= MAX_PRESERVED_BYTES) else {
        return Ok(Preserved::default());
    };
    let Ok(preserved) = serde_json::from_str(text) else { return Ok(Preserved::default()) };
    annotations.remove(PRESERVED_ANNOTATION);
    write_annotations(object, annotations)?;
    Ok(preserved)
}

/// Sets the annotation to `text`, or removes it when `None`.
fn set_annotation(object: &mut Fields<'_>, text: Option<String>) -> Result<(), ConversionError> {
    let current = annotations(object)?;
    let had = current.as_ref().is_some_and(|a| a.contains_key(PRESERVED_ANNOTATION));
    if text.is_none() && !had {
        return Ok(());
    }
    let mut annotations = current.unwrap_or_default();
    match text {
        Some(text) => annotations.insert(PRESERVED_ANNOTATION.into(), text),
        None => annotations.remove(PRESERVED_ANNOTATION),
    };
    write_annotations(object, annotations)
}

fn annotations(object: &Fields<'_>) -> Result<Option<BTreeMap<String, String>>, ConversionError> {
    let Some(metadata) = object_field(object, "metadata")? else { return Ok(None) };
    match metadata.get("annotations") {
        Some(piece) => {
            bounded_map(piece.text(), MAX_ANNOTATIONS, "annotations").map_err(|e| bad_field("metadata.annotations", e))
        }
        None => Ok(None),
    }
}

/// Most fields one object level may have: a stored object, pruned to its schema, has a few dozen.
/// Without a bound, a request of many tiny keys would cost several times its size in memory.
const MAX_FIELDS: usize = 1024;
/// Most annotations: the API server keeps all of an object's annotations within 256 KiB.
const MAX_ANNOTATIONS: usize = 65_536;
/// Largest annotation text read back as preserved fields (the API server's limit for them all).
const MAX_PRESERVED_BYTES: usize = 256 * 1024;
/// Most items of a list whose items' fields move: a stored list holds at most 64.
const MAX_ITEMS: usize = 1024;

/// A JSON object (or `null`) of at most `max` entries, from `text`.
fn bounded_map<'a, V: serde::Deserialize<'a>>(
    text: &'a str,
    max: usize,
    what: &'static str,
) -> Result<Option<BTreeMap<String, V>>, serde_json::Error> {
    let mut deserializer = serde_json::Deserializer::from_str(text);
    let map = crate::util::bounded::optional_map(&mut deserializer, max, what)?;
    deserializer.end()?;
    Ok(map)
}

/// Writes `annotations` back into the metadata, dropping the map when it is empty (as the API
/// server, which never sends an empty one, would).
fn write_annotations(object: &mut Fields<'_>, annotations: BTreeMap<String, String>) -> Result<(), ConversionError> {
    let mut metadata = object_field(object, "metadata")?.unwrap_or_default();
    if annotations.is_empty() {
        metadata.remove("annotations");
    } else {
        metadata.insert("annotations".into(), encoded(&annotations)?);
    }
    object.insert("metadata".into(), encoded(&metadata)?);
    Ok(())
}

/// An object read one level deep, each field borrowed from its text; `None` for `null`.
fn parse_fields(text: &RawValue) -> Result<Option<Fields<'_>>, serde_json::Error> {
    let map: Option<BTreeMap<String, &RawValue>> = bounded_map(text.get(), MAX_FIELDS, "fields")?;
    Ok(map.map(|map| map.into_iter().map(|(k, v)| (k, Piece::Text(v))).collect()))
}

/// An object-valued field read one level deep; `None` when absent or null.
fn object_field<'a>(object: &Fields<'a>, name: &'static str) -> Result<Option<Fields<'a>>, ConversionError> {
    match object.get(name) {
        None => Ok(None),
        Some(Piece::Text(text)) => parse_fields(text).map_err(|e| bad_field(name, e)),
        Some(Piece::New(text)) => {
            let map: Option<BTreeMap<String, Box<RawValue>>> =
                bounded_map(text.get(), MAX_FIELDS, "fields").map_err(|e| bad_field(name, e))?;
            Ok(map.map(|map| map.into_iter().map(|(k, v)| (k, Piece::New(v))).collect()))
        }
    }
}

/// Writes `value` back as `name`, or removes `name` when there is nothing to write (a `null` stays).
fn put_back(object: &mut Fields<'_>, name: &str, value: Option<Fields<'_>>) -> Result<(), ConversionError> {
    match value {
        Some(value) => {
            object.insert(name.into(), encoded(&value)?);
        }
        None => {
            if object.get(name).is_some_and(|v| !is_null(v)) {
                object.remove(name);
            }
        }
    }
    Ok(())
}

fn is_null(piece: &Piece<'_>) -> bool {
    piece.text() == "null"
}

impl Piece<'_> {
    fn text(&self) -> &str {
        match self {
            Piece::Text(text) => text.get(),
            Piece::New(text) => text.get(),
        }
    }
}

/// Adds the annotation's fields that `map` lacks, creating `map` if it had none.
fn merge_missing(
    object: &Fields<'_>,
    name: &'static str,
    map: &mut Option<Fields<'_>>,
    from: BTreeMap<String, Box<RawValue>>,
) -> Result<(), ConversionError> {
    if from.is_empty() {
        return Ok(());
    }
    if map.is_none() && object.get(name).is_some_and(|v| !is_null(v)) {
        return Err(bad_field(name, "is not an object"));
    }
    let map = map.get_or_insert_with(Fields::new);
    for (key, value) in from {
        map.entry(key).or_insert(Piece::New(value));
    }
    Ok(())
}

/// Renames fields; returns whether any of them was present.
fn rename<const N: usize>(map: &mut Fields<'_>, pairs: [(&str, &str); N]) -> bool {
    let mut renamed = false;
    for (from, to) in pairs {
        if let Some(value) = map.remove(from) {
            map.insert(to.into(), value);
            renamed = true;
        }
    }
    renamed
}

/// Removes and returns the fields `keep` does not accept.
fn split_off<'a>(map: &mut Fields<'a>, keep: impl Fn(&str) -> bool) -> Fields<'a> {
    let moved: Vec<String> = map.keys().filter(|k| !keep(k)).cloned().collect();
    moved.into_iter().filter_map(|k| map.remove(&k).map(|v| (k, v))).collect()
}

/// A field value this conversion made, encoded.
fn encoded<T: Serialize + ?Sized>(value: &T) -> Result<Piece<'static>, ConversionError> {
    to_raw_value(value).map(Piece::New).map_err(|e| bad_field("object", e))
}

/// The error for a field that could not be read or written.
fn bad_field(field: &'static str, reason: impl std::fmt::Display) -> ConversionError {
    ConversionError::Field { field, reason: reason.to_string() }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{Value, json};

    fn convert_value(object: Value, to: Version) -> Value {
        let text = to_raw_value(&object).expect("encodes");
        serde_json::from_str(convert(&text, to).expect("converts").get()).expect("decodes")
    }

    fn alpha() -> Value {
        json!({
            "apiVersion": "exposer.hliangzhao.io/v1alpha1",
            "kind": "Balancer",
            "metadata": {"name": "b", "namespace": "ns"},
            "spec": {"ports": [{"port": 80}], "backends": [{"name": "a", "weight": 1}]},
            "status": {"activeBackendsNum": 1, "obsoleteBackendsNum": 0},
        })
    }

    #[test]
    fn v1alpha1_becomes_v1beta1_with_renamed_counts() {
        let beta = convert_value(alpha(), Version::V1beta1);
        assert_eq!(beta["apiVersion"], "exposer.hliangzhao.io/v1beta1");
        assert_eq!(beta["status"], json!({"activeBackends": 1, "obsoleteBackends": 0}));
        assert_eq!(beta["spec"], alpha()["spec"]);
        assert_eq!(beta["metadata"], alpha()["metadata"]);
    }

    #[test]
    fn v1beta1_only_fields_ride_in_the_annotation_and_come_back() {
        let mut beta = convert_value(alpha(), Version::V1beta1);
        beta["spec"]["replicas"] = json!(3);
        beta["status"]["selector"] = json!("balancer.exposer.hliangzhao.io/name=b");
        let alpha = convert_value(beta.clone(), Version::V1alpha1);
        assert_eq!(alpha["spec"].get("replicas"), None);
        assert_eq!(alpha["status"].get("selector"), None);
        let annotation = alpha["metadata"]["annotations"][PRESERVED_ANNOTATION].as_str().expect("annotated");
        assert_eq!(serde_json::from_str::<Value>(annotation).expect("JSON"), json!({"spec": {"replicas": 3}}));
        // The controller writes the derived status field again; it is never restored from the
        // annotation, so the round trip drops it.
        beta["status"].as_object_mut().unwrap().remove("selector");
        assert_eq!(convert_value(alpha, Version::V1beta1), beta);
    }

    #[test]
    fn status_fields_are_never_read_from_the_annotation() {
        let mut object = alpha();
        let forged = json!({"spec": {"replicas": 2}, "status": {"selector": "app=victim"}}).to_string();
        object["metadata"]["annotations"] = json!({PRESERVED_ANNOTATION: forged.clone()});
        let beta = convert_value(object, Version::V1beta1);
        assert_eq!(beta["status"].get("selector"), None, "{beta}");
        // Not an annotation this conversion wrote: it stays as it is, and nothing comes back from it.
        assert_eq!(beta["metadata"]["annotations"][PRESERVED_ANNOTATION], forged);
        assert_eq!(beta["spec"].get("replicas"), None);
    }

    #[test]
    fn many_tiny_keys_are_refused_not_built() {
        // At the top level, which every conversion reads (a spec is read only when it changes).
        let mut object = alpha();
        for i in 0..5000 {
            object[format!("k{i}")] = json!(0);
        }
        let text = to_raw_value(&object).expect("encodes");
        let error = convert(&text, Version::V1beta1).err().map(|e| e.to_string()).unwrap_or_default();
        assert!(error.contains("at most 1024 fields"), "{}", crate::util::echo::cut(&error, 300));
    }

    #[test]
    fn an_unreadable_annotation_is_kept_and_restores_nothing() {
        let mut object = alpha();
        object["metadata"]["annotations"] = json!({PRESERVED_ANNOTATION: "{not json"});
        let beta = convert_value(object.clone(), Version::V1beta1);
        assert_eq!(beta["metadata"]["annotations"][PRESERVED_ANNOTATION], "{not json");
        assert_eq!(beta["spec"].get("replicas"), None);
    }

    #[test]
    fn an_unreadable_spec_is_carried_through_verbatim() {
        let mut object = alpha();
        object["spec"] = json!({"ports": [{"port": 80, "targetPort": 3_000_000_000u64}], "backends": "x"});
        let beta = convert_value(object.clone(), Version::V1beta1);
        assert_eq!(beta["spec"], object["spec"]);
    }

    #[test]
    fn foreign_objects_are_refused_with_a_reason() {
        let not_ours = to_raw_value(&json!({"apiVersion": "v1", "kind": "Service"})).expect("encodes");
        assert_eq!(convert(&not_ours, Version::V1beta1).err(), Some(ConversionError::UnknownVersion("v1".into())));
        let array = to_raw_value(&json!([1, 2])).expect("encodes");
        assert!(matches!(convert(&array, Version::V1beta1), Err(ConversionError::NotAnObject(_))));
    }
}
