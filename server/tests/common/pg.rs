//! The real Postgres for the tests that use it (`store.rs`, `persist.rs`):
//! `IM_TEST_DATABASE_URL`, default `postgres://postgres@127.0.0.1:5432/test`, each test
//! in a fresh schema.

use std::str::FromStr;

/// The test database's address.
fn pg_url() -> String {
    std::env::var("IM_TEST_DATABASE_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".to_owned())
}

/// Connect options for a fresh Postgres schema (stale ones are dropped first).
pub async fn fresh_schema() -> sqlx::postgres::PgConnectOptions {
    let schema = format!(
        "t_{}",
        uuid::Uuid::now_v7().simple().to_string().to_lowercase()
    );
    let admin = sqlx::PgPool::connect(&pg_url())
        .await
        .unwrap_or_else(|e| panic!("Postgres at {} is required: {e}", pg_url()));
    drop_stale_schemas(&admin).await;
    sqlx::query(&format!("CREATE SCHEMA {schema}"))
        .execute(&admin)
        .await
        .unwrap();
    sqlx::postgres::PgConnectOptions::from_str(&pg_url())
        .unwrap()
        .options([("search_path", schema.as_str())])
}

/// Drops test schemas more than an hour old (their uuid v7 names carry the creation time).
async fn drop_stale_schemas(admin: &sqlx::PgPool) {
    let names: Vec<String> =
        sqlx::query_scalar("SELECT nspname::text FROM pg_namespace WHERE nspname LIKE 't\\_%'")
            .fetch_all(admin)
            .await
            .unwrap_or_default();
    let now_ms = im_proto::now_ms() as u64;
    for name in names {
        let created = name
            .get(2..14)
            .and_then(|hex| u64::from_str_radix(hex, 16).ok());
        if created.is_some_and(|ms| now_ms.saturating_sub(ms) > 3_600_000) {
            let _ = sqlx::query(&format!("DROP SCHEMA IF EXISTS {name} CASCADE"))
                .execute(admin)
                .await;
        }
    }
}
