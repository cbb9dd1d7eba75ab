"""What activation statistics (orkpack/stats/) do to the weights at build time, each transform one module: the NF4
choice (:mod:`.nf4`: mode, format, the search's column weights), smoothing folded into the weights (:mod:`.smooth`;
:mod:`.smoothed` reads back what a pack's records say it took), and int8 clipping (:mod:`.clip`). They know nothing
of builds, plans or evals: the build (orkpack/build/) applies them, verify and eval read their records."""
