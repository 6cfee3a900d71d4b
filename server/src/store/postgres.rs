//! Postgres backend (production and cluster mode). Seq allocation is an atomic upsert on
//! the conversation row, so several nodes may commit to one database safely.

use std::str::FromStr;
use std::time::Duration;

use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::PgPool;

use super::sql::sql_store_impl;
use super::StoreError;

/// The Postgres store.
pub struct PgStore {
    write: PgPool,
    read: PgPool,
}

impl PgStore {
    /// Connects with a pool of `pool_size` and runs the migrations.
    pub async fn connect(url: &str, pool_size: u32) -> Result<Self, StoreError> {
        Self::connect_with(PgConnectOptions::from_str(url)?, pool_size).await
    }

    /// As [`PgStore::connect`] with explicit options (tests use a schema per run).
    pub async fn connect_with(
        options: PgConnectOptions,
        pool_size: u32,
    ) -> Result<Self, StoreError> {
        let pool = PgPoolOptions::new()
            .max_connections(pool_size.max(2))
            .acquire_timeout(Duration::from_secs(30))
            .connect_with(options)
            .await?;
        sqlx::migrate!("../migrations/postgres").run(&pool).await?;
        Ok(PgStore {
            write: pool.clone(),
            read: pool,
        })
    }
}

sql_store_impl!(PgStore, sqlx::Postgres, "postgres");
