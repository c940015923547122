"""An OpenAI-compatible chat endpoint that records exact tokens: train the agent you have.

Most agents are programs that call a model through OpenAI's chat API. The
gateway answers those calls from any inference backend of a run and keeps,
per episode, the token sequence the policy really produced:

- :mod:`~sao_gym.gateway.request`: an OpenAI chat-completions body, checked
  into a :class:`~sao_gym.gateway.request.ChatRequest` (an unsupported field is
  an error in OpenAI's shape, never silently ignored);
- :mod:`~sao_gym.gateway.episode`: :class:`~sao_gym.gateway.episode.ChatEpisode`,
  the calls of one episode stitched into exact token segments: a call whose
  messages extend the previous call's (with the reply it got) appends only the
  new observation tokens, masked, and the sampled tokens as sampled, never the
  text the harness sends back re-tokenized; a call that rewrites the history
  starts a new segment;
- :mod:`~sao_gym.gateway.app`: the aiohttp routes, ``/v1/chat/completions``
  (one-off calls) and ``/episodes/ID/v1/chat/completions`` (an episode's), over
  a backend and its tokenizer; ``sao-gym serve`` mounts them;
- :mod:`~sao_gym.gateway.harness`, :mod:`~sao_gym.gateway.tasks`,
  :mod:`~sao_gym.gateway.rollouts`: the user's agent (a program or a command)
  run for one episode against a gateway episode, its tasks, and its episodes as
  rollouts; :mod:`~sao_gym.gateway.workers`: those episodes in worker processes.
"""
