//! The operator's configuration-signing key (see [`signature`](crate::proxy::signature)): kept in
//! a Secret of the operator's own namespace, where tenants do not write, and made by the first
//! replica that finds none. Every replica signs with the same key, so a new leader's
//! configurations are applied by the proxies the last one made.

use std::collections::BTreeMap;

use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::PostParams;
use kube::{Api, Client};
use tokio_util::sync::CancellationToken;

use crate::deploy::{FIELD_MANAGER, SIGNING_KEY_FILE, SIGNING_SECRET};
use crate::proxy::signature::{ConfigSigner, KeyError};
use crate::proxy::{MANAGED_BY, MANAGED_BY_LABEL};
use crate::runtime::retry::RetryDelay;

/// Why the key could not be had this time.
#[allow(missing_docs, reason = "each variant's #[error] message says what it is, naming its fields")]
#[derive(Debug, thiserror::Error)]
enum SigningError {
    #[error("cannot read or create the Secret {SIGNING_SECRET}: {0}")]
    Api(#[from] kube::Error),
    #[error("the Secret {SIGNING_SECRET} has no key {SIGNING_KEY_FILE}")]
    Missing,
    #[error("the Secret {SIGNING_SECRET}'s {SIGNING_KEY_FILE}: {0}")]
    Key(#[from] KeyError),
}

/// The signing key from the Secret in `namespace`, made when there is none; tried again a few
/// seconds apart at most while the API server is away or the Secret is unusable. `None` once
/// `stop` is cancelled.
pub(super) async fn signer(client: &Client, namespace: &str, stop: &CancellationToken) -> Option<ConfigSigner> {
    let api: Api<Secret> = Api::namespaced(client.clone(), namespace);
    let mut delays = RetryDelay::default();
    loop {
        match load_or_create(&api).await {
            Ok(signer) => {
                tracing::info!(secret = SIGNING_SECRET, namespace, key = %signer.public_key(), "signing proxy configurations");
                return Some(signer);
            }
            Err(e) => tracing::error!(error = %e, namespace, "no key to sign proxy configurations with yet; retrying"),
        }
        let delay = delays.next().unwrap_or_default();
        tokio::select! {
            () = tokio::time::sleep(delay) => {}
            () = stop.cancelled() => return None,
        }
    }
}

/// Reads the key, or creates the Secret with a new one; a replica that lost the race to create
/// it reads the winner's.
async fn load_or_create(api: &Api<Secret>) -> Result<ConfigSigner, SigningError> {
    if let Some(secret) = api.get_opt(SIGNING_SECRET).await? {
        return read(&secret);
    }
    let key = ConfigSigner::generate()?;
    let secret = Secret {
        metadata: ObjectMeta {
            name: Some(SIGNING_SECRET.into()),
            labels: Some(BTreeMap::from([(MANAGED_BY_LABEL.to_string(), MANAGED_BY.to_string())])),
            ..ObjectMeta::default()
        },
        immutable: Some(true),
        data: Some(BTreeMap::from([(SIGNING_KEY_FILE.to_string(), ByteString(key.clone()))])),
        ..Secret::default()
    };
    let params = PostParams { field_manager: Some(FIELD_MANAGER.into()), ..PostParams::default() };
    match api.create(&params, &secret).await {
        Ok(_) => Ok(ConfigSigner::from_pkcs8(&key)?),
        Err(kube::Error::Api(status)) if status.code == 409 => read(&api.get(SIGNING_SECRET).await?),
        Err(e) => Err(e.into()),
    }
}

fn read(secret: &Secret) -> Result<ConfigSigner, SigningError> {
    let key = secret.data.as_ref().and_then(|d| d.get(SIGNING_KEY_FILE)).ok_or(SigningError::Missing)?;
    Ok(ConfigSigner::from_pkcs8(&key.0)?)
}
