" planlang: distributed-training plans (*.plan)
" License: Apache-2.0 (SPDX-License-Identifier: Apache-2.0), as the rest of planlang.
autocmd BufNewFile,BufRead *.plan setfiletype plan
