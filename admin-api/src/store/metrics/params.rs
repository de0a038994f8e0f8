//! Numbered placeholders for statements with many parameters.

use crate::store::Backend;

/// Rows per multi-row statement (an `INSERT`, or a list of clients): 500 × 12 columns (the
/// widest table) stays far below both databases' limits on bound parameters (SQLite
/// 32,766, PostgreSQL 65,535).
pub(super) const ROWS_PER_STATEMENT: usize = 500;

/// Placeholders for a statement with many parameters, bound in the order they appear:
/// `$1, $2, ...` on PostgreSQL, and plain `?` on SQLite. SQLite looks a numbered
/// parameter's name up in a list (sqlx asks for every parameter's name when binding), so
/// `$N` costs time quadratic in the number of parameters: 87% of a flush's time with
/// 5,000 of them. Anonymous `?` parameters have no names to look up.
pub(super) struct Params {
    backend: Backend,
    n: usize,
}

impl Params {
    pub(super) fn new(backend: Backend) -> Params {
        Params { backend, n: 0 }
    }

    pub(super) fn next(&mut self) -> String {
        self.n += 1;
        match self.backend {
            Backend::Sqlite => "?".to_string(),
            Backend::Postgres => format!("${}", self.n),
        }
    }

    /// `p, p, p` for `n` parameters.
    pub(super) fn list(&mut self, n: usize) -> String {
        (0..n).map(|_| self.next()).collect::<Vec<_>>().join(", ")
    }

    /// `(p, p, p), (p, p, p)` for `rows` rows of `columns` columns.
    pub(super) fn values(&mut self, rows: usize, columns: usize) -> String {
        (0..rows)
            .map(|_| format!("({})", self.list(columns)))
            .collect::<Vec<_>>()
            .join(", ")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_clauses_number_every_parameter() {
        assert_eq!(
            Params::new(Backend::Postgres).values(2, 3),
            "($1, $2, $3), ($4, $5, $6)"
        );
        assert_eq!(Params::new(Backend::Sqlite).values(1, 2), "(?, ?)");
    }
}
