"""Models over the OpenAI chat-completions protocol: `client` (any endpoint, as evaluated model or
engineer), `api_policy` (such an endpoint scored like an in-process policy), `server` (this
project's models served, `launch.serve`), `local` (loading a run or a checkpoint)."""
