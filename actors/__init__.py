"""Ray actors: thin wrappers that own placement, concurrency and fault handling around one
``solaris`` object each. Every ``.remote`` / ``ray.get`` lives here, in serve/ or jobs/."""
