/* microtrain core: the op table. Each kernel file defines mt_op_<NAME> (its
 * check, prepare and run); this file only collects them by op code, from the
 * op list generated from host/microtrain/format.py. */
#include "mt_core.h"

#define MT_DECLARE(name) extern const mt_opdef_t mt_op_##name;
MT_FOR_EACH_OP(MT_DECLARE)

#define MT_ENTRY(name) [MT_OP_##name] = &mt_op_##name,
const mt_opdef_t *const mt_opdefs[MT_OP_MAX + 1] = { MT_FOR_EACH_OP(MT_ENTRY) };
