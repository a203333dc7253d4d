//! A cache's compact form of an object (its metadata and only what the controller reads) is
//! still a resource of the object's kind: kube's reflector keys, watches and names it as such.

/// Implements kube's `Resource` for `$form`, a compact form of `$kind` with a `metadata` field:
/// the kind, group, version, plural and scope of `$kind`, the metadata of its own.
///
/// `resource_as_kind!(impl[K: Resource<DynamicType = ()>] Cached<K> => K);`
macro_rules! resource_as_kind {
    (impl[$($generics:tt)*] $form:ty => $kind:ty) => {
        impl<$($generics)*> ::kube::Resource for $form {
            type DynamicType = ();
            type Scope = <$kind as ::kube::Resource>::Scope;

            fn kind(dt: &()) -> ::std::borrow::Cow<'_, str> {
                <$kind as ::kube::Resource>::kind(dt)
            }

            fn group(dt: &()) -> ::std::borrow::Cow<'_, str> {
                <$kind as ::kube::Resource>::group(dt)
            }

            fn version(dt: &()) -> ::std::borrow::Cow<'_, str> {
                <$kind as ::kube::Resource>::version(dt)
            }

            fn plural(dt: &()) -> ::std::borrow::Cow<'_, str> {
                <$kind as ::kube::Resource>::plural(dt)
            }

            fn meta(&self) -> &::k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta {
                &self.metadata
            }

            fn meta_mut(&mut self) -> &mut ::k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta {
                &mut self.metadata
            }
        }
    };
}

pub(crate) use resource_as_kind;
