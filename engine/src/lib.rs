//! aisql engine: Substrait plans with AI functions consumed through DataFusion.
